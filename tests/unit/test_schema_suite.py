"""bench/schemas/: the structured-output suite's recorded verdicts are the server's (static
bounds at the default settings, then the compile with the dev model's vocabulary), at
least 20 schemas are accepted, together they use every feature the benchmark is about, and
SOURCES.md names the source of every file."""

from __future__ import annotations

from bench import schema_suite


def test_recorded_verdicts_are_the_servers(dev_model, capsys) -> None:
    assert schema_suite.check(write=False, tokenizer_dir=dev_model) == 0, capsys.readouterr().out


def test_enough_schemas_with_every_feature_and_a_source() -> None:
    entries = schema_suite.entries()
    accepted = [e for e in entries if e["verdict"] == "accepted"]
    assert len(accepted) >= 20
    used = {f for e in accepted for f in e["features"]}
    assert used == set(schema_suite.FEATURES)
    sources = (schema_suite.SUITE / "SOURCES.md").read_text()
    files = {p.name for p in schema_suite.SUITE.glob("*.json")} - {"suite.json"}
    assert files == {e["file"] for e in entries}
    for e in entries:
        assert e["file"] in sources and e["path"] in sources and e["commit"] in sources
        assert e["verdict"] == "accepted" or e["reason"]


def test_suite_bodies_and_the_profile_difference() -> None:
    from bench.gpu.structured import profile_figures, suite_body

    schema = {"type": "object"}
    assert suite_body("plain", None, 8) == {"ignore_eos": True}
    assert suite_body("schema", schema, 8)["response_format"]["json_schema"]["schema"] == schema
    tool = suite_body("tool", schema, 8)
    assert (
        tool["tool_choice"] == "required" and tool["tools"][0]["function"]["parameters"] == schema
    )
    before = {"seconds": {"step_constrained": 1.0, "fill": 0.1}, "counts": {"step_constrained": 10}}
    after = {
        "seconds": {"step_constrained": 3.0, "fill": 0.3, "step_plain": 0.5},
        "counts": {"step_constrained": 30, "rows_constrained": 1280, "step_plain": 5},
    }
    got = profile_figures(before, after)
    assert got["step_constrained_ms"] == 100.0 and got["rows_constrained_mean"] == 64.0
    assert got["fill_ms_per_step"] == 10.0 and got["step_plain_ms"] == 100.0
    assert profile_figures(before, {}) == {}
