from types import SimpleNamespace

from splitserve.target.eos import eos_ids


def _target(tok_eos, gen_eos):
    tokenizer = None if tok_eos is False else SimpleNamespace(eos_token_id=tok_eos)
    model = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=gen_eos))
    return SimpleNamespace(tokenizer=tokenizer, model=model)


def test_eos_ids_joins_tokenizer_and_generation_config():
    assert eos_ids(_target(2, 2)) == {2}
    assert eos_ids(_target(2, [2, 7])) == {2, 7}  # chat models list several stop ids
    assert eos_ids(_target(None, 5)) == {5}
    assert eos_ids(_target(3, None)) == {3}


def test_eos_ids_without_tokenizer_is_empty():
    # bare-id targets (tests' tiny models) carry a default generation-config EOS that means nothing
    assert eos_ids(_target(False, 2)) == frozenset()
