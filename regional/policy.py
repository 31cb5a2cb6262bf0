"""The checkpoint policy (DESIGN §4 rule 5, §7): its shape, and loading it from a TOML file,
`REGIONAL_...` environment variables and code overrides.

The policy is a tree of frozen msgspec Structs. Durations are float seconds;
`max_consecutive_regional` is None for "unlimited". `load_policy` resolves one policy from up to
three layers with the precedence code > environment > file > defaults, validates every value it
is given (also values a higher layer overrides: a bad file is bad), and records where each
effective value came from. Keys are written in kebab case, as in the file
(`checkpointing.region.max-failure-ratio`); the reference (`docs/reference/policy.md`) is
generated from `KEY_DOCS` and the Structs.

About 500 lines, on purpose: the policy's shape, its value types with their error texts, and
the three layers it is loaded from are one concept; keeping them together keeps the messages of
a file, an environment variable and code the same.

>>> resolved = load_policy(env={"REGIONAL_CHECKPOINTING__INTERVAL": "2 min"})
>>> resolved.policy.checkpointing.interval
120.0
>>> resolved.sources["checkpointing.interval"], resolved.sources["checkpointing.timeout"]
('env REGIONAL_CHECKPOINTING__INTERVAL', 'default')
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import hashlib
import math
import os
import re
import reprlib
import types
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import msgspec
import pyarrow as pa

from metadata.bounded_read import byte_size, read_local_file
from regional.errors import PolicyError

__all__ = [
    "KEY_DOCS",
    "MAX_COUNT",
    "MAX_DURATION_SECONDS",
    "MAX_POLICY_FILE_BYTES",
    "CheckpointingPolicy",
    "EventTimePolicy",
    "FileMergingPolicy",
    "Policy",
    "PolicyKey",
    "RegionPolicy",
    "ResolvedPolicy",
    "RestorePolicy",
    "format_duration",
    "load_policy",
    "parse_duration",
    "parse_interval",
    "policy_fingerprint",
    "policy_keys",
]

#: The longest duration a key takes (365 days): far beyond any useful interval or timeout, and
#: small enough that deadlines in epoch milliseconds (`round(seconds * 1000)`) and thread waits
#: stay well inside their 64-bit limits.
MAX_DURATION_SECONDS = 365 * 86400.0

#: The largest value of every whole-number key (1,000,000): far beyond any useful count of
#: checkpoints, failures or fallbacks, and small enough for every counter and for the 64-bit
#: integers of checkpoint metadata (a larger number would pass a check and fail mid-run).
MAX_COUNT = 1_000_000

#: The largest policy file read (1 MiB): a policy is a few lines of TOML, and a bound keeps a
#: wrong path (`/dev/zero`, a FIFO, a log file) from being read until memory runs out.
MAX_POLICY_FILE_BYTES = 1024 * 1024

# Value types of the policy keys. Each description is the "allowed" part of error messages.
_Seconds = Annotated[
    float,
    msgspec.Meta(
        gt=0,
        le=MAX_DURATION_SECONDS,
        description='a duration > 0 and at most 365 d: "500 ms", "30 s", "2 min", "1 h", "1 d" '
        "or a number of seconds",
    ),
]
#: The interval, in the policy and in `regional run --interval` alike (`parse_interval`): 0
#: (epochs follow each other without a wait) to 365 d.
_Interval = Annotated[
    float,
    msgspec.Meta(
        ge=0,
        le=MAX_DURATION_SECONDS,
        description='a duration from 0 (no wait) to 365 d: "0", "500 ms", "30 s", "2 min", '
        '"1 h", "1 d" or a number of seconds',
    ),
]
_SecondsOrUnlimited = (
    Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=MAX_DURATION_SECONDS,
            description='a duration > 0 and at most 365 d ("30 s", "15 min", "1 h") or "unlimited"',
        ),
    ]
    | None
)
#: A duration, or "off" (None): the idle timeout.
_OptionalSeconds = (
    Annotated[
        float,
        msgspec.Meta(
            gt=0,
            le=MAX_DURATION_SECONDS,
            description='a duration > 0 and at most 365 d ("30 s", "5 min") or "off"',
        ),
    ]
    | None
)
_Ratio = Annotated[float, msgspec.Meta(ge=0, le=1, description="a number from 0 to 1")]
_Count = Annotated[
    int, msgspec.Meta(ge=0, le=MAX_COUNT, description="a whole number from 0 to 1000000")
]
_Retained = Annotated[
    int, msgspec.Meta(ge=1, le=MAX_COUNT, description="a whole number from 1 to 1000000")
]
_Limit = (
    Annotated[
        int,
        msgspec.Meta(
            ge=0, le=MAX_COUNT, description='a whole number from 0 to 1000000 or "unlimited"'
        ),
    ]
    | None
)
_Location = (
    Annotated[str, msgspec.Meta(min_length=1, description="a local path or a pyarrow.fs URI")]
    | None
)


class _Section(
    msgspec.Struct, frozen=True, kw_only=True, rename="kebab", forbid_unknown_fields=True
):
    """A policy table. Values are checked when built in code too, with the file's messages
    (msgspec checks `Meta` constraints only when decoding)."""

    def __post_init__(self) -> None:
        for field in msgspec.structs.fields(self):
            value = getattr(self, field.name)
            if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
                if not isinstance(value, field.type):  # a nested table checks itself
                    table = _SECTION_PATHS[field.type].rstrip(".")
                    raise self._invalid(field, value, f"a {field.type.__name__} ([{table}])")
                continue
            try:
                msgspec.convert(value, field.type)
            except msgspec.ValidationError:
                raise self._invalid(field, value, _allowed(field.type)) from None

    def _invalid(self, field: msgspec.structs.FieldInfo, value: Any, allowed: str) -> PolicyError:
        path = _SECTION_PATHS[type(self)] + field.encode_name
        return PolicyError(
            f"policy built in code: {path} = {_shown(value)} is invalid; expected {allowed}"
        )


class RegionPolicy(_Section, frozen=True):
    """`[checkpointing.region]`: regional checkpoints and their staleness limits.

    A unit that fell back in `max_unit_fallbacks` checkpoints in a row is *stuck*. With
    `on_unit_fallback_limit = "isolate"` (the default) checkpoints keep completing regionally
    with it on its owner's state, and the job fails once it has been stuck longer than
    `max_stuck_time` (seconds on the driver's clock; None: "unlimited"). With `"force-fresh"`
    the unit must be fresh in the next checkpoint, which aborts (rule 3a) if it fails again
    (docs/stuck-units.md). `max_consecutive_regional` defaults to None ("unlimited"): a forced
    global checkpoint aborts whenever any unit fails, so under frequent partial failures it
    costs every unit an epoch and bounds nothing the per-unit limits do not (the measurements
    are in docs/stuck-units.md).
    """

    enabled: bool = True
    max_failure_ratio: _Ratio = 0.3
    max_consecutive_regional: _Limit = None
    max_unit_fallbacks: _Count = 3
    timeout: _Seconds = 120.0
    on_unit_fallback_limit: Literal["isolate", "force-fresh"] = "isolate"
    max_stuck_time: _SecondsOrUnlimited = 900.0


class FileMergingPolicy(_Section, frozen=True):
    """`[checkpointing.file-merging]`: merged state files (DESIGN §4 rule 16,
    docs/file-merging.md). `min_live_share`: when a completed checkpoint's fallback units keep
    a physical state file of an older checkpoint of which the checkpoint references less than
    this share of bytes, the driver copies those units' segments into one file of the new
    checkpoint, so the big file goes after `num-retained` checkpoints instead of after the
    units recover (0: never)."""

    min_live_share: _Ratio = 0.5


class CheckpointingPolicy(_Section, frozen=True):
    """`[checkpointing]`: how often, how long, how many to keep, where."""

    interval: _Interval = 10.0
    timeout: _Seconds = 600.0
    num_retained: _Retained = 3
    tolerable_failed_checkpoints: _Count = 10
    dir: _Location = None
    region: RegionPolicy = RegionPolicy()
    file_merging: FileMergingPolicy = FileMergingPolicy()


class RestorePolicy(_Section, frozen=True):
    """`[restore]`: whether a restored checkpoint becomes ours (`claim`) or stays the user's."""

    mode: Literal["claim", "no-claim"] = "claim"


class EventTimePolicy(_Section, frozen=True):
    """`[event-time]`: watermarks (DESIGN §4 rule 15, docs/event-time.md). `idle-timeout`:
    a source split that delivered nothing for that long (processing time) stops holding its
    subtask's watermark back ("off" by default: outside the determinism rule when on).
    `writer-fallback`: an exchange writer that fell back `hold`s the downstream watermark
    (exact results, the default) or, with `exclude`, is left out after `exclude-after`
    fallbacks in a row (fresher results; its records may then be late). `stall-after`: how
    many completed checkpoints an input's watermark may stay put while its operator's state
    grows before the input is reported stalled (`regional.runtime.stalled_inputs`)."""

    idle_timeout: _OptionalSeconds = None
    writer_fallback: Literal["hold", "exclude"] = "hold"
    exclude_after: _Retained = 3
    stall_after: _Retained = 5


class Policy(_Section, frozen=True):
    """The whole policy. `Policy()` is the default policy."""

    checkpointing: CheckpointingPolicy = CheckpointingPolicy()
    restore: RestorePolicy = RestorePolicy()
    event_time: EventTimePolicy = EventTimePolicy()


# --- durations --------------------------------------------------------------------------------

_UNITS: dict[str, float] = {
    **dict.fromkeys(("ms", "milli", "millis", "millisecond", "milliseconds"), 0.001),
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hour", "hours"), 3600.0),
    **dict.fromkeys(("d", "day", "days"), 86400.0),
}
_DURATION = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([a-zA-Z]*)\s*")


def parse_duration(value: Any) -> float:
    """Seconds from `"500 ms"`, `"30 s"`, `"2 min"`, `"1 h"`, `"1 d"`, a bare number of seconds
    (as a number or a string) or a `timedelta`. Raises ValueError for anything else.

    Units and their spellings follow Flink's (`ms`, `s`/`sec`, `min`/`m`, `h`, `d`, singular
    and plural words), but a number without a unit means seconds here, not milliseconds.

    >>> parse_duration("2 min"), parse_duration("500ms"), parse_duration(30), parse_duration("1.5")
    (120.0, 0.5, 30.0, 1.5)
    """
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        number, unit = match.groups()
        if unit.lower() not in _UNITS:
            raise ValueError(f"unknown unit {unit!r}")
        seconds = float(number) * _UNITS[unit.lower()]
    else:
        raise ValueError("not a duration")
    if not math.isfinite(seconds):
        raise ValueError("not a finite duration")
    return seconds


def parse_interval(value: Any) -> float:
    """The idle interval in seconds, by the one rule of `checkpointing.interval` (policy file,
    environment, code) and `regional run --interval`: a duration as `parse_duration` reads it,
    from 0 (never wait) to 365 d. Raises ValueError saying what is allowed.

    >>> parse_interval("0"), parse_interval(0), parse_interval("500 ms")
    (0.0, 0.0, 0.5)
    >>> parse_interval("-1 s")
    Traceback (most recent call last):
    ...
    ValueError: expected a duration from 0 (no wait) to 365 d: "0", "500 ms", "30 s", "2 min", \
"1 h", "1 d" or a number of seconds
    """
    try:
        return msgspec.convert(parse_duration(value), _Interval)
    except (ValueError, msgspec.ValidationError):
        raise ValueError(f"expected {_allowed(_Interval)}") from None


def format_duration(seconds: float) -> str:
    """The shortest exact way to write `seconds` with one unit (ms, s, min, h).

    >>> [format_duration(s) for s in (0.5, 30, 120, 90, 3600, 1.25)]
    ['500 ms', '30 s', '2 min', '90 s', '1 h', '1250 ms']
    """
    for unit, size in (("h", 3600.0), ("min", 60.0), ("s", 1.0), ("ms", 0.001)):
        count = seconds / size
        if count >= 1 and abs(count - round(count)) <= 1e-9 * count:
            return f"{round(count)} {unit}"
    return f"{seconds!r} s"


# --- the keys, derived from the Structs ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Key:
    path: str  # kebab key path, e.g. "checkpointing.region.max-failure-ratio"
    type: Any
    default: Any

    @property
    def allowed(self) -> str:
        return _allowed(self.type)


def _allowed(tp: Any) -> str:
    """What a value of type `tp` may be, in words (the fix part of an error message)."""
    if get_origin(tp) is Annotated:
        return get_args(tp)[1].description
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(f'"{v}"' for v in get_args(tp))
    if tp is bool:
        return "true or false"
    return _allowed(next(t for t in get_args(tp) if t is not type(None)))


def _env_name(path: str) -> str:
    return "REGIONAL_" + "__".join(p.upper().replace("-", "_") for p in path.split("."))


def _walk(struct: type[msgspec.Struct], prefix: str = "") -> Iterator[_Key]:
    for field in msgspec.structs.fields(struct):
        path = prefix + field.encode_name
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            yield from _walk(field.type, path + ".")
        else:
            yield _Key(path, field.type, field.default)


def _section_paths(struct: type[msgspec.Struct], prefix: str = "") -> Iterator[tuple[type, str]]:
    yield struct, prefix
    for field in msgspec.structs.fields(struct):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            yield from _section_paths(field.type, prefix + field.encode_name + ".")


_KEYS: dict[str, _Key] = {key.path: key for key in _walk(Policy)}
#: The key-path prefix of each table's Struct, e.g. RegionPolicy -> "checkpointing.region.".
_SECTION_PATHS: dict[type, str] = dict(_section_paths(Policy))
_SECTIONS = frozenset(path.rpartition(".")[0] for path in _KEYS)
#: Flink's spelling (FLIP-600), accepted as an alias. Flink's 0 still allows one regional
#: checkpoint; here 0 means never regional.
_ALIASES = {
    "checkpointing.region.max-consecutive-failures": "checkpointing.region.max-consecutive-regional"
}
_ENV_NAMES = {_env_name(path): path for path in [*_KEYS, *_ALIASES]}
_ENV_SCOPES = tuple(_env_name(s) for s in _SECTIONS if "." not in s)


# --- resolving ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Given:
    """One value given for a key by one layer: where it came from and how to name that."""

    path: str
    raw: Any
    source: str  # "file <path>", "env <VAR>" or "code"
    where: str  # start of an error message: "policy file x.toml", "environment variable X", ...


#: Longer shown values are cut (a bad value can be a whole nested document).
_SHOWN_WIDTH = 80


def _shown(value: Any) -> str:
    """A value as the user wrote it (TOML-like: strings quoted, `inf`), cut to `_SHOWN_WIDTH`."""
    if isinstance(value, float):
        return repr(value)
    try:
        text = msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError, RecursionError):
        text = reprlib.repr(value)
    return text if len(text) <= _SHOWN_WIDTH else text[: _SHOWN_WIDTH - 3] + "..."


def _canonical(path: str, raw: Any, where: str) -> str:
    path = _ALIASES.get(path, path)
    if path not in _KEYS and isinstance(raw, dict):
        close = difflib.get_close_matches(path, sorted(_SECTIONS), n=1)
        hint = f"did you mean [{close[0]}]?" if close else "tables: " + ", ".join(sorted(_SECTIONS))
        raise PolicyError(f"{where}: unknown table [{path}]; {hint}")
    if path not in _KEYS:
        close = difflib.get_close_matches(path, [*_KEYS, *_ALIASES], n=1)
        hint = f"did you mean {close[0]}?" if close else "known keys: " + ", ".join(_KEYS)
        raise PolicyError(f"{where}: unknown key {path} (= {_shown(raw)}); {hint}")
    return path


def _flatten(table: Mapping[str, Any], where: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in table.items():
        path = prefix + name
        if path in _SECTIONS:
            if not isinstance(value, dict):
                raise PolicyError(
                    f"{where}: {path} = {_shown(value)} is invalid; expected a table [{path}]"
                )
            yield from _flatten(value, where, path + ".")
        else:
            yield path, value


def _layer(items: Iterator[tuple[str, Any, str, str]]) -> list[_Given]:
    """The values of one layer by canonical key path; a key given twice (alias) is an error."""
    given: dict[str, _Given] = {}
    for path, raw, source, where in items:
        key = _canonical(path, raw, where)
        if key in given:
            raise PolicyError(f"{where}: {key} is given twice (once as {path}); keep only {key}")
        given[key] = _Given(key, raw, source, where)
    return list(given.values())


def _file_layer(file: str | Path) -> list[_Given]:
    where = f"policy file {file}"
    try:
        data = read_local_file(file, MAX_POLICY_FILE_BYTES)
    except FileNotFoundError:
        raise PolicyError(f"{where} does not exist; pass the path of a TOML policy file") from None
    except OSError as exc:
        raise PolicyError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if data is None:
        raise PolicyError(
            f"{where} is larger than {byte_size(MAX_POLICY_FILE_BYTES)}, the most a policy file "
            "may hold; a policy is a few lines of TOML: pass the right file"
        )
    try:  # checked here, before the parser, so the error never depends on its wording
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8 TOML"
        ) from None
    try:
        table = msgspec.toml.decode(text)
    except RecursionError:  # the TOML parser recurses once per level of nesting
        raise PolicyError(
            f"{where} nests arrays or tables too deeply to be read; policy values are plain "
            "numbers, strings and booleans in tables at most two deep ([checkpointing.region])"
        ) from None
    except msgspec.DecodeError as exc:
        raise PolicyError(f"{where} is not valid TOML: {exc}") from None
    source = f"file {file}"
    return _layer((path, raw, source, where) for path, raw in _flatten(table, where))


def _env_layer(env: Mapping[str, str]) -> list[_Given]:
    def items() -> Iterator[tuple[str, Any, str, str]]:
        for name in sorted(env):
            if not name.startswith(_ENV_SCOPES):
                continue  # not a policy variable (e.g. another REGIONAL_ setting)
            where = f"environment variable {name}"
            path = _ENV_NAMES.get(name)
            if path is None:
                close = difflib.get_close_matches(name, list(_ENV_NAMES), n=1)
                hint = f"did you mean {close[0]}?" if close else "unset it"
                raise PolicyError(f"{where} (= {_shown(env[name])}) is not a policy key; {hint}")
            if env[name].strip() == "":
                raise PolicyError(
                    f"{where}: {path} is empty; set {_KEYS[_ALIASES.get(path, path)].allowed}"
                    " or unset the variable"
                )
            yield path, env[name], f"env {name}", where

    return _layer(items())


def _code_layer(overrides: Mapping[str, Any]) -> list[_Given]:
    where = "policy override"
    return _layer((path, raw, "code", where) for path, raw in _flatten(overrides, where))


def _coerce(given: _Given, *, from_text: bool) -> Any:
    """The validated value of `given`, parsed with the file's rules (`from_text`: an environment
    string, so "0.5", "true" and "3" are read as numbers and booleans)."""
    key = _KEYS[given.path]
    try:
        value = given.raw
        if key.type in (_Seconds, _Interval):
            value = parse_duration(value)
        elif key.type == _SecondsOrUnlimited:
            value = None if value == "unlimited" else parse_duration(value)
        elif key.type == _OptionalSeconds:
            value = None if value == "off" else parse_duration(value)
        elif key.type == _Limit and value == "unlimited":
            value = None
        elif from_text and value == "null":
            raise ValueError("TOML has no null")  # msgspec's lax mode would read it as None
        return msgspec.convert(value, key.type, strict=not from_text)
    except (ValueError, msgspec.ValidationError):
        raise PolicyError(
            f"{given.where}: {key.path} = {_shown(given.raw)} is invalid; expected {key.allowed}"
        ) from None


def _nest(values: Mapping[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, value in values.items():
        *sections, leaf = path.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree


def policy_fingerprint(policy: Policy) -> str:
    """A stable hash (hex SHA-256 of the policy's canonical JSON) of the effective policy, for
    the `policy_fingerprint` of checkpoint metadata. Where a value came from does not matter.

    >>> policy_fingerprint(Policy()) == policy_fingerprint(load_policy(env={}).policy)
    True
    """
    data = msgspec.to_builtins(policy)
    if policy.event_time == EventTimePolicy():  # added later: defaults keep older fingerprints
        del data["event-time"]
    elif policy.event_time.stall_after == EventTimePolicy().stall_after:  # added later still
        del data["event-time"]["stall-after"]
    if policy.checkpointing.file_merging == FileMergingPolicy():  # added later, likewise
        del data["checkpointing"]["file-merging"]
    return hashlib.sha256(msgspec.json.encode(data)).hexdigest()


@dataclasses.dataclass(frozen=True)
class ResolvedPolicy:
    """The effective policy and, per key path, where its value came from: `"default"`,
    `"file <path>"`, `"env REGIONAL_..."` or `"code"`."""

    policy: Policy
    sources: Mapping[str, str]

    def fingerprint(self) -> str:
        """`policy_fingerprint(self.policy)`."""
        return policy_fingerprint(self.policy)

    def table(self, *, readable: bool = True) -> pa.Table:
        """One row per key: `key` (string), `value`, `source` (string), in file order.

        With `readable`, `value` is a string as a person writes it in the file (`"30 s"`,
        `"unlimited"`, null when unset); otherwise it is the policy's own value (durations in
        float seconds, null for unlimited or unset) in a dense union column, for JSON.
        """
        values = dict(_flatten(msgspec.to_builtins(self.policy), "policy"))
        keys = list(_KEYS)
        if readable:
            column = pa.array([_readable(k, values[k]) for k in keys], pa.string())
        else:
            column = _union([values[k] for k in keys])
        return pa.table(
            {
                "key": pa.array(keys, pa.string()),
                "value": column,
                "source": pa.array([self.sources[k] for k in keys], pa.string()),
            }
        )


def _readable(path: str, value: Any) -> str | None:
    key = _KEYS[path]
    if key.type == _Interval and value == 0:
        return "0"
    if key.type in (_Seconds, _Interval, _SecondsOrUnlimited) and value is not None:
        return format_duration(value)
    if key.type == _OptionalSeconds:
        return "off" if value is None else format_duration(value)
    if key.type in (_Limit, _SecondsOrUnlimited) and value is None:
        return "unlimited"
    if isinstance(value, bool):
        return "true" if value else "false"
    return None if value is None else str(value)


def _union(values: list[Any]) -> pa.Array:
    """A dense union array holding `values` of mixed Python types (float, int, bool, str, None)."""
    kinds = [(float, pa.float64()), (int, pa.int64()), (bool, pa.bool_()), (str, pa.string())]
    members: list[list[Any]] = [[] for _ in range(len(kinds) + 1)]
    codes, offsets = [], []
    for value in values:
        code = next((i for i, (t, _) in enumerate(kinds) if type(value) is t), len(kinds))
        codes.append(code)
        offsets.append(len(members[code]))
        members[code].append(value)
    children = [pa.array(m, t) for m, (_, t) in zip(members, kinds, strict=False)]
    children.append(pa.nulls(len(members[-1])))
    return pa.UnionArray.from_dense(
        pa.array(codes, pa.int8()),
        pa.array(offsets, pa.int32()),
        children,
        ["float", "int", "bool", "string", "null"],
    )


def load_policy(
    file: str | Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ResolvedPolicy:
    """Resolve the policy: `overrides` (code) > `env` > `file` > defaults.

    `env` defaults to `os.environ`; only variables starting with `REGIONAL_CHECKPOINTING` or
    `REGIONAL_RESTORE` are read (and must be policy keys). `overrides` are keyed by kebab key
    path (or nested by table, as in the file) and take the same values as the file (also
    `timedelta` for durations, None for "unlimited"). Every given value is validated; the
    first bad one raises `PolicyError` naming the file / variable / override, the key path,
    the value and what is allowed.

    >>> load_policy(env={}, overrides={"checkpointing.region.max-consecutive-regional":
    ...     "unlimited"}).policy.checkpointing.region.max_consecutive_regional is None
    True
    """
    layers = [
        (_file_layer(file) if file is not None else [], False),
        (_env_layer(os.environ if env is None else env), True),
        (_code_layer(overrides or {}), False),
    ]
    values = {path: key.default for path, key in _KEYS.items()}
    sources = dict.fromkeys(_KEYS, "default")
    for given_values, from_text in layers:
        for given in given_values:
            values[given.path] = _coerce(given, from_text=from_text)
            sources[given.path] = given.source
    policy = msgspec.convert(_nest(values), Policy)
    return ResolvedPolicy(policy, types.MappingProxyType(sources))


#: What each key does and why its default is what it is (the policy reference is generated
#: from these and the Structs: `policy_keys`; a test checks that every key has its text).
KEY_DOCS: Mapping[str, str] = {
    "checkpointing.interval": (
        "The time from one trigger to the next **after an epoch that read no records** "
        "(measured from the previous trigger, as Flink does): an idle streaming job "
        "checkpoints every interval instead of spinning. Epochs that read records follow each"
        " other at once, so a backlog or a bounded job (a backfill) runs at full speed; every"
        " checkpoint is an epoch here, so spacing busy epochs would only slow the job down. "
        "`regional run --interval` overrides it; `SparkRuntime` takes `interval=` (default "
        "0). An epoch on Spark costs about 0.3 s of fixed overhead for a few region tasks "
        "(measured for the Spark runtime), about 3 % at 10 s."
    ),
    "checkpointing.timeout": ("Flink's default: a checkpoint not decided by then is aborted."),
    "checkpointing.num-retained": (
        "Flink keeps 1. We keep 3 so a damaged latest checkpoint still leaves an older one to"
        " restore (DESIGN §4 rule 12). Because fallback state points at its owner, keeping "
        "more checkpoints costs only the files they do not share."
    ),
    "checkpointing.tolerable-failed-checkpoints": (
        "Aborted checkpoints in a row before the job fails. Flink's default is 0, but with "
        "regional checkpoints some aborts are expected, e.g. while a unit over its fallback "
        "limit is still failing. 10 gives such a unit about 10 intervals to recover."
    ),
    "checkpointing.dir": (
        "The checkpoint root. In code the job gets its root explicitly; `regional run` "
        "without it and without `--checkpoint-dir` uses `.regional/checkpoints` in the "
        "pipeline file's folder (see `regional run --help`). A relative path is relative to "
        "the working directory of the process that runs the job."
    ),
    "checkpointing.region.enabled": (
        "This is what the product is for. Jobs that cannot use it (one fallback unit, "
        "changelog state, union state) are detected and run with global checkpoints, with a "
        "message saying why. Flink's default is `false`."
    ),
    "checkpointing.region.max-failure-ratio": (
        "Same as FLIP-600. A checkpoint with more failed units than this share of all units "
        "is aborted; a share equal to the limit passes, because the comparison is exact "
        "(rational). Above about 30 % the likely cause is a system-wide problem such as a "
        "storage outage, not one slow region. `1` allows checkpoints made only of old state."
    ),
    "checkpointing.region.max-consecutive-regional": (
        "After this many regional checkpoints in a row, the next checkpoint must be global "
        "(tier 1; if it fails, it is aborted and the count starts again). `0` means never "
        'regional; `"unlimited"` (the default) turns the job-level limit off. A forced global'
        " checkpoint needs every unit to succeed in one epoch: with 64 regions failing "
        "independently at p = 0.05 per epoch that happens 3.7 % of the time, so a forced "
        "global aborts about 96 % of the time and every region redoes the epoch, without "
        "bounding staleness better. Staleness is bounded per unit instead "
        "(`max-unit-fallbacks`, `max-stuck-time`). Set a number (Flink's default is 2) when a"
        " downstream system needs global checkpoints at a bounded interval."
    ),
    "checkpointing.region.max-unit-fallbacks": (
        "A unit that fell back in this many checkpoints in a row is *stuck*. What happens "
        "then is `on-unit-fallback-limit`: by default it stays on its owner's state while "
        "checkpoints complete around it, shown loudly (event, progress, metric, report, "
        "`inspect lag`), until `max-stuck-time` fails the job. `0` means a unit is stuck from"
        " its first fallback."
    ),
    "checkpointing.region.timeout": (
        "A region that has not answered by then is declined, so the rest of the checkpoint "
        "completes long before `checkpointing.timeout`. Keep it below "
        "`checkpointing.timeout`, or it never fires (not enforced)."
    ),
    "restore.mode": (
        "Resuming from your own latest checkpoint, the common case, is a claim: the cleaner "
        'may delete it later, and regional checkpoints go on at once. Use `"no-claim"` for a '
        "savepoint or a checkpoint you must not touch; checkpoints are then global until one "
        "succeeds. Flink's default is NO_CLAIM."
    ),
    "checkpointing.region.on-unit-fallback-limit": (
        '`"isolate"` (the default): a stuck unit never stops the healthy ones; it stays on '
        "its owner's state, is retried every epoch, and the job fails once it has been stuck "
        'longer than `max-stuck-time`. `"force-fresh"`: the stuck unit must be fresh in the '
        "next checkpoint, and if it fails again that checkpoint aborts (rule 3a) and counts "
        "towards `tolerable-failed-checkpoints` (the behaviour before; an abort does not help"
        " the stuck unit, it only makes the healthy units redo their epoch)."
    ),
    "checkpointing.region.max-stuck-time": (
        "How long a unit may stay stuck before the job fails with an error naming the unit, "
        "what it reads, its last cause and the fix; measured on the driver's clock from the "
        "checkpoint that made it stuck. 15 minutes rides out a broker restart or a lost "
        "worker (the unit is retried every epoch and recovers on its own) and still pages "
        'someone the same quarter hour for a real bug. `"unlimited"`: never fail, only report'
        " (alert on `regional_unit_stuck_seconds`)."
    ),
    "checkpointing.file-merging.min-live-share": (
        "Bounds the space a unit on fallback keeps alive. A unit that falls back re-uses its "
        "owner's segment, which keeps the owner's whole merged task file (every unit of that "
        "Spark task). When a checkpoint completes and references less than this share of such"
        " a file's bytes, the driver copies the fallback units' segments into one new file of "
        "that checkpoint (`chk-<id>/compacted-<run>.state`), verifies it by reading it back, "
        "and points their handles at the copy; the old file then goes after `num-retained` "
        "checkpoints instead of when the units recover. Cost: one extra read of the live "
        "segments and one write per compacting checkpoint; a failed copy keeps the old "
        "handles and records a warning in the event. 0.5 keeps at most about twice the live "
        "bytes per file; `1` compacts any file with a dead byte, `0` never compacts "
        "(docs/file-merging.md)."
    ),
    "event-time.idle-timeout": (
        "A source split that delivered no record for this long (processing time) stops "
        "holding its subtask's watermark back. Off by default: processing time is outside "
        "the determinism rule (DESIGN §4 rule 13), so with it on a replay after a fallback may"
        " judge records differently. Turn it on when some splits go quiet for good and their "
        "windows must still close (docs/event-time.md)."
    ),
    "event-time.writer-fallback": (
        '`"hold"` (the default): an exchange writer that fell back holds the downstream '
        "watermark where its committed data is, so none of its records is late because of "
        'the fallback and windows equal a fault-free run\'s row for row. `"exclude"`: a '
        "writer that fell back `exclude-after` checkpoints in a row is left out, so windows "
        "close without it; its records behind the watermark are then late (exactness traded "
        "for freshness)."
    ),
    "event-time.exclude-after": (
        'With `writer-fallback = "exclude"`: how many checkpoints in a row a writer must have '
        "fallen back before it is left out. 3 matches `max-unit-fallbacks`: a writer that is "
        "about to be reported stuck."
    ),
    "event-time.stall-after": (
        "An operator that keeps records until a watermark passes them (a join, a window, "
        "`drop_duplicates`, timers) is reported once (progress, event log, metric, report) "
        "when one input's watermark has not moved over this many completed checkpoints while "
        "the operator's state grew without shrinking. 5 checkpoints (under a minute at the "
        "default interval) is longer than a busy job's watermark normally stands still and "
        "short enough to warn before the state is large; raise it for a source whose data "
        "comes in rare bursts (docs/how-to/cluster.md)."
    ),
}


@dataclasses.dataclass(frozen=True)
class PolicyKey:
    """One key of the policy file, as the reference documents it: its kebab `path`, its
    `default` as a file would write it, what values are `allowed`, and its `env` variable."""

    path: str
    default: str
    allowed: str
    env: str


def policy_keys() -> list[PolicyKey]:
    """Every key of the policy, in the order of the Structs.

    >>> policy_keys()[0]
    PolicyKey(path='checkpointing.interval', default='10 s', allowed='a duration from 0 (no \
wait) to 365 d: "0", "500 ms", "30 s", "2 min", "1 h", "1 d" or a number of seconds', \
env='REGIONAL_CHECKPOINTING__INTERVAL')
    """
    return [
        PolicyKey(key.path, _default_text(key), key.allowed, _env_name(key.path))
        for key in _KEYS.values()
    ]


def _default_text(key: _Key) -> str:
    if key.default is None:
        return '"unlimited"' if "unlimited" in key.allowed else "unset"
    if isinstance(key.default, bool):
        return str(key.default).lower()
    if "duration" in key.allowed:
        return format_duration(key.default)
    return str(key.default)
