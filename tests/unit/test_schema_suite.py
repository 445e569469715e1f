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
