"""`regional policy check FILE [--json]`: table, JSON, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from regional.cli import main


@pytest.fixture(autouse=True)
def no_policy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own REGIONAL_ variables must not leak into these tests."""
    for name in list(os.environ):
        if name.startswith("REGIONAL_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def test_check_prints_every_key_with_value_and_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path,
        "[checkpointing]\ninterval = '30 s'\n"
        "[checkpointing.region]\nmax-consecutive-regional = 'unlimited'\n",
    )
    monkeypatch.setenv("REGIONAL_RESTORE__MODE", "no-claim")
    monkeypatch.chdir(path.parent)
    assert main(["policy", "check", path.name]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "key                                            value      source",
        "---------------------------------------------  ---------  --------------------------",
        "checkpointing.interval                         30 s       file policy.toml",
        "checkpointing.timeout                          10 min     default",
        "checkpointing.num-retained                     3          default",
        "checkpointing.tolerable-failed-checkpoints     10         default",
        "checkpointing.dir                              -          default",
        "checkpointing.region.enabled                   true       default",
        "checkpointing.region.max-failure-ratio         0.3        default",
        "checkpointing.region.max-consecutive-regional  unlimited  file policy.toml",
        "checkpointing.region.max-unit-fallbacks        3          default",
        "checkpointing.region.timeout                   2 min      default",
        "checkpointing.region.on-unit-fallback-limit    isolate    default",
        "checkpointing.region.max-stuck-time            15 min     default",
        "checkpointing.file-merging.min-live-share      0.5        default",
        "restore.mode                                   no-claim   env REGIONAL_RESTORE__MODE",
        "event-time.idle-timeout                        off        default",
        "event-time.writer-fallback                     hold       default",
        "event-time.exclude-after                       3          default",
        "event-time.stall-after                         5          default",
        "",
        "checkpointing.interval: the wait from one trigger to the next after an epoch that read "
        "no records; epochs that read records follow at once (regional run --interval overrides "
        "it)",
    ]


def test_check_json_gives_the_policy_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "[checkpointing]\ninterval = '500 ms'\ndir = '/data/chk'\n")
    assert main(["policy", "check", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    source = f"file {path}"
    assert rows == [
        {"key": "checkpointing.interval", "value": 0.5, "source": source},
        {"key": "checkpointing.timeout", "value": 600.0, "source": "default"},
        {"key": "checkpointing.num-retained", "value": 3, "source": "default"},
        {"key": "checkpointing.tolerable-failed-checkpoints", "value": 10, "source": "default"},
        {"key": "checkpointing.dir", "value": "/data/chk", "source": source},
        {"key": "checkpointing.region.enabled", "value": True, "source": "default"},
        {"key": "checkpointing.region.max-failure-ratio", "value": 0.3, "source": "default"},
        {
            "key": "checkpointing.region.max-consecutive-regional",
            "value": None,
            "source": "default",
        },
        {"key": "checkpointing.region.max-unit-fallbacks", "value": 3, "source": "default"},
        {"key": "checkpointing.region.timeout", "value": 120.0, "source": "default"},
        {
            "key": "checkpointing.region.on-unit-fallback-limit",
            "value": "isolate",
            "source": "default",
        },
        {"key": "checkpointing.region.max-stuck-time", "value": 900.0, "source": "default"},
        {"key": "checkpointing.file-merging.min-live-share", "value": 0.5, "source": "default"},
        {"key": "restore.mode", "value": "claim", "source": "default"},
        {"key": "event-time.idle-timeout", "value": None, "source": "default"},
        {"key": "event-time.writer-fallback", "value": "hold", "source": "default"},
        {"key": "event-time.exclude-after", "value": 3, "source": "default"},
        {"key": "event-time.stall-after", "value": 5, "source": "default"},
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[checkpointing.region]\nmax-failure-ratio = 1.5\n",
            "regional policy: policy file FILE: checkpointing.region.max-failure-ratio = 1.5 "
            "is invalid; expected a number from 0 to 1",
        ),
        (
            "[checkpointing\n",
            "regional policy: policy file FILE is not valid TOML: "
            "Expected ']' at the end of a table declaration (at line 1, column 15)",
        ),
    ],
)
def test_invalid_file_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path, text)
    assert main(["policy", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.replace(str(path), "FILE") == message + "\n"


def test_bad_env_variable_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REGIONAL_CHECKPOINTING__REGION__MAX_UNIT_FALLBACKS", "-2")
    assert main(["policy", "check", str(write(tmp_path, "")), "--json"]) == 2
    assert capsys.readouterr().err == (
        "regional policy: environment variable REGIONAL_CHECKPOINTING__REGION__MAX_UNIT_FALLBACKS"
        ': checkpointing.region.max-unit-fallbacks = "-2" is invalid; '
        "expected a whole number from 0 to 1000000\n"
    )


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.toml"
    assert main(["policy", "check", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"regional policy: policy file {missing} does not exist; "
        "pass the path of a TOML policy file\n"
    )


def test_check_without_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["policy", "check"])
    assert info.value.code == 2
    assert "FILE" in capsys.readouterr().err
