"""Policy table files (App. A.4): round trip, model check, corrupt files; the default table;
the policy registry."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pask_agent.errors import ConfigError, PolicyTableError
from pask_agent.policy.default_table import (
    DEFAULT_MODEL_ID,
    DEFAULT_TABLE_PATH,
    DEFAULT_TOKENIZER_SHA256,
    HAND_WRITTEN_TABLE_PATH,
    build_default_table,
)
from pask_agent.policy.registry import PolicyRegistry
from pask_agent.policy.table import PolicyTable
from pask_agent.policy.tokenizer_hash import tokenizer_hash

OTHER_HASH = "cd" * 32


def _load(path: Path, table: PolicyTable) -> PolicyTable:
    return PolicyTable.load(path, model_id=table.model_id, tokenizer_hash=table.tokenizer_hash)


def test_round_trip_is_exact(tmp_path: Path) -> None:
    table = build_default_table()
    path = tmp_path / "t.json"
    table.save(path)
    again = _load(path, table)
    assert again == table
    again.save(tmp_path / "u.json")
    assert (tmp_path / "u.json").read_text() == path.read_text()
    assert again.checksum() == json.loads(path.read_text())["checksum"]


def test_shipped_default_is_the_calibrated_table_of_the_shipped_traces() -> None:
    from pask_agent.calibration.inputs import count_lines, file_digest

    shipped = PolicyTable.load(
        DEFAULT_TABLE_PATH, model_id=DEFAULT_MODEL_ID, tokenizer_hash=DEFAULT_TOKENIZER_SHA256
    )
    assert shipped.source == "calibrated" and shipped.calibration is not None
    root = DEFAULT_TABLE_PATH.parents[2]
    for trace_file in shipped.calibration["traces"]:
        path = root / trace_file["path"]
        assert file_digest(path) == trace_file["sha256"], f"{path} changed since calibration"
        assert count_lines(path) == trace_file["n"]
    assert shipped.calibration["wall_seconds"] > 0 and shipped.calibration["cpu_count"] >= 1
    assert 0 < shipped.budget_decode <= 1 and shipped.budget_total == 0.33
    assert shipped.expected_output_tokens and shipped.expected_output_tokens > 0


def test_committed_hand_written_fixture_matches_builder() -> None:
    committed = PolicyTable.load(
        HAND_WRITTEN_TABLE_PATH, model_id=DEFAULT_MODEL_ID, tokenizer_hash=DEFAULT_TOKENIZER_SHA256
    )
    built = build_default_table()
    assert committed == built
    assert HAND_WRITTEN_TABLE_PATH.read_text() == built.to_json()
    assert committed.source == "hand-written"
    assert (committed.num_layers, committed.layer_boundaries) == (24, (8, 16))
    # The paper's protective intuition: dispatch keys keep H in every group, always.
    assert {e.floor for e in committed.decode["schema_bearing/dispatch_key"]} == {"H"}
    assert [e.floor for e in committed.prefill["function_name"]] == ["H", "L", "L"]
    assert [e.base for e in committed.prefill["function_name"]] == ["H", "H", "H"]
    # Generated tokens are never released (releasing scaffold made parallel calls repeat).
    assert all(e.floor != "R" for es in committed.decode.values() for e in es)


def test_other_model_refused_unless_transfer(tmp_path: Path, make_table) -> None:
    table = make_table()
    path = tmp_path / "t.json"
    table.save(path)
    with pytest.raises(PolicyTableError, match="allow_transfer=True"):
        PolicyTable.load(path, model_id="another-model", tokenizer_hash=table.tokenizer_hash)
    with pytest.raises(PolicyTableError, match="calibrated for model 'tiny-test-model'"):
        PolicyTable.load(path, model_id=table.model_id, tokenizer_hash=OTHER_HASH)
    moved = PolicyTable.load(
        path, model_id="another-model", tokenizer_hash=OTHER_HASH, allow_transfer=True
    )
    assert moved == table


def _saved(tmp_path: Path, make_table) -> tuple[PolicyTable, Path, dict]:
    table = make_table()
    path = tmp_path / "t.json"
    table.save(path)
    return table, path, json.loads(path.read_text())


def _rewrite(path: Path, raw: dict, *, fix_checksum: bool) -> None:
    body = {k: v for k, v in raw.items() if k != "checksum"}
    if fix_checksum:
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        raw = {**body, "checksum": hashlib.sha256(canonical.encode()).hexdigest()}
    path.write_text(json.dumps(raw))


def test_truncated_file(tmp_path: Path, make_table) -> None:
    table, path, _ = _saved(tmp_path, make_table)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(PolicyTableError, match="not valid JSON.*truncated or corrupt"):
        _load(path, table)


def test_edited_value_fails_checksum(tmp_path: Path, make_table) -> None:
    table, path, raw = _saved(tmp_path, make_table)
    raw["budget_decode"] = 0.9
    _rewrite(path, raw, fix_checksum=False)
    with pytest.raises(PolicyTableError, match="checksum mismatch.*re-save"):
        _load(path, table)


def test_missing_field_is_a_schema_violation(tmp_path: Path, make_table) -> None:
    table, path, raw = _saved(tmp_path, make_table)
    del raw["reserve"]
    _rewrite(path, raw, fix_checksum=True)
    with pytest.raises(PolicyTableError, match="schema violation.*reserve: Field required"):
        _load(path, table)


def test_missing_checksum_and_wrong_version(tmp_path: Path, make_table) -> None:
    table, path, raw = _saved(tmp_path, make_table)
    _rewrite(path, {k: v for k, v in raw.items() if k != "checksum"}, fix_checksum=False)
    with pytest.raises(PolicyTableError, match="missing 'checksum'"):
        _load(path, table)
    raw["schema_version"] = 2
    _rewrite(path, raw, fix_checksum=True)
    with pytest.raises(PolicyTableError, match="schema_version 2 is not supported"):
        _load(path, table)
    with pytest.raises(PolicyTableError, match="cannot read"):
        _load(tmp_path / "absent.json", table)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("layer_boundaries", [8, 15], "do not match App. A.2"),
        ("decode", {"schema_bearing/nonsense": []}, "decode key"),
        ("tie_order", ["0:R->L"], "tie_order must list"),
        ("decode_fallback", {"pure_scaffold": "free_generation"}, "no such decode bucket"),
        ("span_labels", ["schema_scaffold", "protected_content"], "span_labels must be"),
        ("span_labels", [], "span_labels must be"),
        ("budget_prefill", 1.5, "less than or equal to 1"),
    ],
)
def test_semantic_validation(
    tmp_path: Path, make_table, field: str, value: object, message: str
) -> None:
    table, path, raw = _saved(tmp_path, make_table)
    raw[field] = value
    _rewrite(path, raw, fix_checksum=True)
    with pytest.raises(PolicyTableError, match=message):
        _load(path, table)


def test_tokenizer_hash_of_folder_and_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes(b'{"model": {}}')
    expected = hashlib.sha256(b'{"model": {}}').hexdigest()
    assert tokenizer_hash(tmp_path) == expected
    assert tokenizer_hash(str(tmp_path / "tokenizer.json")) == expected
    with pytest.raises(PolicyTableError, match="no tokenizer.json"):
        tokenizer_hash(tmp_path / "missing")


@pytest.mark.slow
def test_default_tokenizer_hash_matches_bundled_model() -> None:
    # A loaded tokenizer hashes the tokenizer.json of the folder it was loaded from.
    from pask_agent.runtime.models.loading import load_tokenizer

    assert tokenizer_hash(load_tokenizer("default")) == DEFAULT_TOKENIZER_SHA256


def test_registry() -> None:
    registry = PolicyRegistry()

    @registry.register("full")
    class Full:
        pass

    @registry.register("h2o")
    class H2O:
        pass

    assert registry.get("full") is Full
    assert registry.names() == ("full", "h2o")
    assert "h2o" in registry
    with pytest.raises(ConfigError, match="unknown policy 'snap'; valid policies: full, h2o"):
        registry.get("snap")
    with pytest.raises(ConfigError, match="already registered"):
        registry.register("full")(H2O)
    with pytest.raises(ConfigError, match="lowercase identifier"):
        registry.register("Snap-KV")


def test_runtime_refuses_a_table_made_for_another_model(smollm2) -> None:
    """The shipped table belongs to the default model: PASK on SmolLM2 must say so, on the path
    users take (``Runtime.chat``), unless the transfer is asked for on purpose."""
    import anyio

    from pask_agent.errors import PolicyTableError
    from pask_agent.policy.pask import PaskPolicy
    from pask_agent.runtime.runtime import Runtime

    msgs = [{"role": "user", "content": "Say hi"}]

    async def main() -> int:
        async with Runtime.open(smollm2) as rt:
            with pytest.raises(PolicyTableError, match="calibrated for model 'Qwen2.5-Coder"):
                await rt.chat(msgs, policy="pask", budget=0.33, max_new_tokens=4)
            moved = PaskPolicy(allow_transfer=True)
            out = await rt.chat(msgs, policy=moved, budget=0.33, max_new_tokens=4)
            return out.usage.completion_tokens

    assert anyio.run(main) == 4
