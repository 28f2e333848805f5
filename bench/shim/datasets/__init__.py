"""A stand-in for the few `datasets` calls that splitserve.data.samples makes when tokenizing a
JSONL file (Dataset.from_dict, .map one row at a time, .to_dict), for a GPU machine that has torch
and transformers but not `datasets` (bench/recipe_gpu.sh puts it on PYTHONPATH only there)."""


def disable_progress_bars():
    pass


class Dataset:
    def __init__(self, rows):
        self.rows = rows

    @classmethod
    def from_dict(cls, columns):
        keys = list(columns)
        return cls([dict(zip(keys, values)) for values in zip(*(columns[k] for k in keys))])

    def __len__(self):
        return len(self.rows)

    def map(self, fn, fn_kwargs=None, remove_columns=(), **_):
        out = []
        for row in self.rows:
            new = {**row, **fn(row, **(fn_kwargs or {}))}
            for k in remove_columns or ():
                new.pop(k, None)
            out.append(new)
        return Dataset(out)

    def to_dict(self):
        keys = list(self.rows[0]) if self.rows else []
        return {k: [r[k] for r in self.rows] for k in keys}

    def save_to_disk(self, path):
        import os
        import pickle

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "rows.pkl"), "wb") as f:
            pickle.dump(self.rows, f)


class DatasetDict(dict):
    pass


def load_from_disk(path):
    import os
    import pickle

    with open(os.path.join(path, "rows.pkl"), "rb") as f:
        return Dataset(pickle.load(f))
