"""Loading the policy: file, environment and code layers, validation messages, sources."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.errors import PolicyError
from regional.policy import (
    CheckpointingPolicy,
    Policy,
    RegionPolicy,
    RestorePolicy,
    format_duration,
    load_policy,
    parse_duration,
    policy_fingerprint,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "policy.toml"
DURATION = (
    'a duration > 0 and at most 365 d: "500 ms", "30 s", "2 min", "1 h", "1 d" '
    "or a number of seconds"
)
#: What checkpointing.interval takes (the rule `regional run --interval` shares): 0 too.
INTERVAL = (
    'a duration from 0 (no wait) to 365 d: "0", "500 ms", "30 s", "2 min", "1 h", "1 d" '
    "or a number of seconds"
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path


def file_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as info:
        load_policy(path, env={})
    assert info.value.exit_code == 2
    return str(info.value).replace(str(path), "FILE")


# --- the file -------------------------------------------------------------------------------


def test_file_values_are_decoded_into_the_structs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[checkpointing]
interval = "30 s"
timeout = 90
num-retained = 5
dir = "s3://bucket/chk"

[checkpointing.region]
enabled = false
max-failure-ratio = 1
max-consecutive-regional = "unlimited"
timeout = "500 ms"

[restore]
mode = "no-claim"
""",
    )
    resolved = load_policy(path, env={})
    assert resolved.policy == Policy(
        checkpointing=CheckpointingPolicy(
            interval=30.0,
            timeout=90.0,
            num_retained=5,
            dir="s3://bucket/chk",
            region=RegionPolicy(
                enabled=False, max_failure_ratio=1.0, max_consecutive_regional=None, timeout=0.5
            ),
        ),
        restore=RestorePolicy(mode="no-claim"),
    )
    assert isinstance(resolved.policy.checkpointing.region.max_failure_ratio, float)
    assert resolved.sources["checkpointing.interval"] == f"file {path}"
    assert resolved.sources["checkpointing.tolerable-failed-checkpoints"] == "default"
    assert resolved.sources["checkpointing.region.max-unit-fallbacks"] == "default"


def test_example_file_sets_every_key_but_dir_to_its_default() -> None:
    resolved = load_policy(EXAMPLE, env={})
    assert resolved.policy == Policy()
    assert {k for k, s in resolved.sources.items() if s == "default"} == {"checkpointing.dir"}


def test_zero_consecutive_regional_means_never_regional_not_unlimited(tmp_path: Path) -> None:
    path = write(tmp_path, "[checkpointing.region]\nmax-consecutive-regional = 0\n")
    assert load_policy(path, env={}).policy.checkpointing.region.max_consecutive_regional == 0


def test_flink_spelling_max_consecutive_failures_is_an_alias(tmp_path: Path) -> None:
    path = write(tmp_path, "[checkpointing.region]\nmax-consecutive-failures = 4\n")
    resolved = load_policy(path, env={})
    assert resolved.policy.checkpointing.region.max_consecutive_regional == 4
    assert resolved.sources["checkpointing.region.max-consecutive-regional"] == f"file {path}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[checkpointing.region]\nmax-failure-rate = 0.5\n",
            "policy file FILE: unknown key checkpointing.region.max-failure-rate (= 0.5); "
            "did you mean checkpointing.region.max-failure-ratio?",
        ),
        (
            "[checkpoint]\ninterval = '1 s'\n",
            "policy file FILE: unknown table [checkpoint]; did you mean [checkpointing]?",
        ),
        (
            "checkpointing = 5\n",
            "policy file FILE: checkpointing = 5 is invalid; expected a table [checkpointing]",
        ),
        (
            "[checkpointing.region]\nenabled = 'yes'\n",
            'policy file FILE: checkpointing.region.enabled = "yes" is invalid; '
            "expected true or false",
        ),
        (
            "[checkpointing]\nnum-retained = true\n",
            "policy file FILE: checkpointing.num-retained = true is invalid; "
            "expected a whole number from 1 to 1000000",
        ),
        (
            "[checkpointing.region]\nmax-failure-ratio = 1.5\n",
            "policy file FILE: checkpointing.region.max-failure-ratio = 1.5 is invalid; "
            "expected a number from 0 to 1",
        ),
        (
            "[checkpointing.region]\nmax-unit-fallbacks = -1\n",
            "policy file FILE: checkpointing.region.max-unit-fallbacks = -1 is invalid; "
            "expected a whole number from 0 to 1000000",
        ),
        (
            "[checkpointing]\ntolerable-failed-checkpoints = 2.5\n",
            "policy file FILE: checkpointing.tolerable-failed-checkpoints = 2.5 is invalid; "
            "expected a whole number from 0 to 1000000",
        ),
        (
            "[checkpointing]\ninterval = 'ten s'\n",
            'policy file FILE: checkpointing.interval = "ten s" is invalid; expected ' + INTERVAL,
        ),
        (
            "[checkpointing.region]\ntimeout = '3 parsecs'\n",
            'policy file FILE: checkpointing.region.timeout = "3 parsecs" is invalid; expected '
            + DURATION,
        ),
        (
            "[checkpointing]\ntimeout = 0\n",
            "policy file FILE: checkpointing.timeout = 0 is invalid; expected " + DURATION,
        ),
        (
            "[checkpointing]\ninterval = inf\n",
            "policy file FILE: checkpointing.interval = inf is invalid; expected " + INTERVAL,
        ),
        (
            "[restore]\nmode = 'keep'\n",
            'policy file FILE: restore.mode = "keep" is invalid; '
            'expected one of "claim", "no-claim"',
        ),
        (
            "[checkpointing]\nnum-retained = 0\n",
            "policy file FILE: checkpointing.num-retained = 0 is invalid; "
            "expected a whole number from 1 to 1000000",
        ),
        (
            "[checkpointing]\nnum-retained = 'unlimited'\n",
            'policy file FILE: checkpointing.num-retained = "unlimited" is invalid; '
            "expected a whole number from 1 to 1000000",
        ),
        (
            "[checkpointing.region]\nmax-consecutive-regional = -3\n",
            "policy file FILE: checkpointing.region.max-consecutive-regional = -3 is invalid; "
            'expected a whole number from 0 to 1000000 or "unlimited"',
        ),
        (
            "[event-time]\nstall-after = 0\n",
            "policy file FILE: event-time.stall-after = 0 is invalid; "
            "expected a whole number from 1 to 1000000",
        ),
        (
            "[checkpointing]\ndir = ''\n",
            'policy file FILE: checkpointing.dir = "" is invalid; '
            "expected a local path or a pyarrow.fs URI",
        ),
        (
            "[checkpointing.region]\nmax-consecutive-regional = 3\nmax-consecutive-failures = 4\n",
            "policy file FILE: checkpointing.region.max-consecutive-regional is given twice "
            "(once as checkpointing.region.max-consecutive-failures); keep only "
            "checkpointing.region.max-consecutive-regional",
        ),
    ],
)
def test_every_bad_value_names_file_key_value_and_what_is_allowed(
    tmp_path: Path, text: str, message: str
) -> None:
    assert file_error(tmp_path, text) == message


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    message = file_error(tmp_path, "[checkpointing]\ninterval = \n")
    assert message == "policy file FILE is not valid TOML: Invalid value (at line 2, column 12)"


def test_missing_file_and_directory_are_policy_errors(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"policy file .*nope\.toml does not exist"):
        load_policy(tmp_path / "nope.toml", env={})
    with pytest.raises(
        PolicyError, match=rf"policy file {tmp_path} cannot be read: Is a directory"
    ):
        load_policy(tmp_path, env={})


def test_a_bad_file_value_fails_even_when_env_overrides_it(tmp_path: Path) -> None:
    path = write(tmp_path, "[checkpointing.region]\nmax-failure-ratio = 2\n")
    env = {"REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO": "0.5"}
    with pytest.raises(PolicyError, match="max-failure-ratio = 2 is invalid"):
        load_policy(path, env=env)


# --- environment ----------------------------------------------------------------------------


def test_env_values_are_parsed_with_the_file_rules() -> None:
    env = {
        "REGIONAL_CHECKPOINTING__INTERVAL": "2 min",
        "REGIONAL_CHECKPOINTING__TIMEOUT": "45",
        "REGIONAL_CHECKPOINTING__NUM_RETAINED": "7",
        "REGIONAL_CHECKPOINTING__DIR": "/data/chk",
        "REGIONAL_CHECKPOINTING__REGION__ENABLED": "false",
        "REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO": "0.5",
        "REGIONAL_CHECKPOINTING__REGION__MAX_CONSECUTIVE_REGIONAL": "unlimited",
        "REGIONAL_RESTORE__MODE": "no-claim",
        "REGIONAL_HOME": "/elsewhere",  # not a policy variable: ignored
        "regional_checkpointing__interval": "1 s",  # lower case: not read
    }
    resolved = load_policy(env=env)
    checkpointing = resolved.policy.checkpointing
    assert (checkpointing.interval, checkpointing.timeout, checkpointing.num_retained) == (
        120.0,
        45.0,
        7,
    )
    assert checkpointing.dir == "/data/chk"
    assert checkpointing.region.enabled is False
    assert checkpointing.region.max_failure_ratio == 0.5
    assert checkpointing.region.max_consecutive_regional is None
    assert resolved.policy.restore.mode == "no-claim"
    assert resolved.sources["restore.mode"] == "env REGIONAL_RESTORE__MODE"
    assert resolved.sources["checkpointing.region.max-unit-fallbacks"] == "default"


def test_env_alias_of_flink_spelling() -> None:
    env = {"REGIONAL_CHECKPOINTING__REGION__MAX_CONSECUTIVE_FAILURES": "2"}
    resolved = load_policy(env=env)
    assert resolved.policy.checkpointing.region.max_consecutive_regional == 2
    assert resolved.sources["checkpointing.region.max-consecutive-regional"] == (
        "env REGIONAL_CHECKPOINTING__REGION__MAX_CONSECUTIVE_FAILURES"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO": "1.5"},
            "environment variable REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO: "
            'checkpointing.region.max-failure-ratio = "1.5" is invalid; '
            "expected a number from 0 to 1",
        ),
        (
            {"REGIONAL_CHECKPOINTING__REGION__ENABLED": "yes"},
            "environment variable REGIONAL_CHECKPOINTING__REGION__ENABLED: "
            'checkpointing.region.enabled = "yes" is invalid; expected true or false',
        ),
        (
            {"REGIONAL_CHECKPOINTING__INTERVAL": "ten s"},
            "environment variable REGIONAL_CHECKPOINTING__INTERVAL: "
            'checkpointing.interval = "ten s" is invalid; expected ' + INTERVAL,
        ),
        (
            {"REGIONAL_CHECKPOINTING_INTERVAL": "10 s"},
            'environment variable REGIONAL_CHECKPOINTING_INTERVAL (= "10 s") is not a policy '
            "key; did you mean REGIONAL_CHECKPOINTING__INTERVAL?",
        ),
        (
            {"REGIONAL_RESTORE__MODES": "claim"},
            'environment variable REGIONAL_RESTORE__MODES (= "claim") is not a policy key; '
            "did you mean REGIONAL_RESTORE__MODE?",
        ),
        (
            {"REGIONAL_CHECKPOINTING__REGION__MAX_CONSECUTIVE_REGIONAL": "null"},
            "environment variable REGIONAL_CHECKPOINTING__REGION__MAX_CONSECUTIVE_REGIONAL: "
            'checkpointing.region.max-consecutive-regional = "null" is invalid; '
            'expected a whole number from 0 to 1000000 or "unlimited"',
        ),
        (
            {"REGIONAL_CHECKPOINTING__NUM_RETAINED": " "},
            "environment variable REGIONAL_CHECKPOINTING__NUM_RETAINED: "
            "checkpointing.num-retained is empty; set a whole number from 1 to 1000000 or unset "
            "the variable",
        ),
    ],
)
def test_env_errors_name_the_variable_key_and_value(env: dict[str, str], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(env=env)
    assert str(info.value) == message


# --- precedence and code overrides ------------------------------------------------------------


def test_precedence_code_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[checkpointing]\ninterval = '1 s'\nnum-retained = 2\n"
        "[checkpointing.region]\nmax-failure-ratio = 0.1\n",
    )
    env = {
        "REGIONAL_CHECKPOINTING__INTERVAL": "2 s",
        "REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO": "0.2",
    }
    resolved = load_policy(path, env=env, overrides={"checkpointing.interval": "3 s"})
    checkpointing = resolved.policy.checkpointing
    assert checkpointing.interval == 3.0
    assert checkpointing.region.max_failure_ratio == 0.2
    assert checkpointing.num_retained == 2
    assert checkpointing.timeout == 600.0
    assert {k: v for k, v in resolved.sources.items() if v != "default"} == {
        "checkpointing.interval": "code",
        "checkpointing.region.max-failure-ratio": (
            "env REGIONAL_CHECKPOINTING__REGION__MAX_FAILURE_RATIO"
        ),
        "checkpointing.num-retained": f"file {path}",
    }


def test_code_overrides_take_file_values_timedelta_and_none() -> None:
    resolved = load_policy(
        env={},
        overrides={
            "checkpointing.timeout": dt.timedelta(minutes=5),
            "checkpointing.region.max-consecutive-regional": None,
            "checkpointing.region.max-failure-ratio": 0,
        },
    )
    region = resolved.policy.checkpointing.region
    assert resolved.policy.checkpointing.timeout == 300.0
    assert resolved.sources["checkpointing.timeout"] == "code"
    assert region.max_consecutive_regional is None
    assert region.max_failure_ratio == 0.0


def test_code_overrides_may_be_nested_like_the_file() -> None:
    nested = load_policy(env={}, overrides={"checkpointing": {"region": {"timeout": "1 min"}}})
    assert nested.policy.checkpointing.region.timeout == 60.0
    assert nested.sources["checkpointing.region.timeout"] == "code"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"checkpointing.intervall": 5},
            "policy override: unknown key checkpointing.intervall (= 5); "
            "did you mean checkpointing.interval?",
        ),
        (
            {"checkpointing": 3},
            "policy override: checkpointing = 3 is invalid; expected a table [checkpointing]",
        ),
        (
            {"checkpointing.num-retained": "3"},
            'policy override: checkpointing.num-retained = "3" is invalid; '
            "expected a whole number from 1 to 1000000",
        ),
    ],
)
def test_code_override_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(env={}, overrides=overrides)
    assert str(info.value) == message


# --- fingerprint and durations ----------------------------------------------------------------


def test_fingerprint_depends_on_values_not_sources(tmp_path: Path) -> None:
    default = load_policy(env={})
    # Pinned: checkpoint metadata stores it, so it must not change between releases.
    assert default.fingerprint() == (
        "ceffd579c084e027f8e13c65801c1eb27ff8a87b14cb1386aa680b785e9e3f36"
    )
    assert load_policy(EXAMPLE, env={}).fingerprint() == default.fingerprint()
    changed = load_policy(env={}, overrides={"checkpointing.region.max-failure-ratio": 0.31})
    assert changed.fingerprint() != default.fingerprint()
    assert policy_fingerprint(changed.policy) == changed.fingerprint()


def test_the_stall_threshold_is_a_key_whose_default_keeps_older_fingerprints() -> None:
    """`event-time.stall-after` (default 5) came after the other event-time keys: a policy
    that leaves it at its default has the fingerprint it had before the key existed."""
    assert load_policy(env={}).policy.event_time.stall_after == 5
    exclude = load_policy(env={}, overrides={"event-time.writer-fallback": "exclude"})
    assert exclude.fingerprint() == (  # pinned: computed before the key existed
        "bb0a3b0a3f0c4e3f4eaedea2b9823b0ab89f72fba5bd6f692a446164d47702b0"
    )
    later = load_policy(env={"REGIONAL_EVENT_TIME__STALL_AFTER": "8"})
    assert later.policy.event_time.stall_after == 8
    assert later.sources["event-time.stall-after"] == "env REGIONAL_EVENT_TIME__STALL_AFTER"
    assert later.fingerprint() != load_policy(env={}).fingerprint()


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30 s", 30.0),
        ("2 min", 120.0),
        ("500 ms", 0.5),
        ("1 h", 3600.0),
        ("1 d", 86400.0),
        ("1.5 minutes", 90.0),
        ("10sec", 10.0),
        ("3 M", 180.0),
        (" 7 ", 7.0),
        (".5 s", 0.5),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["ten s", "10 parsecs", "", "1 s 2", "s", "nan"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=10**9))
def test_format_duration_round_trips_whole_milliseconds(millis: int) -> None:
    seconds = millis / 1000
    text = format_duration(seconds)
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12)
    assert text.split()[0].isdigit()
