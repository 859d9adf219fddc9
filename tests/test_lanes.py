"""Lane chains and workloop specs: what parses, and how each bad form is refused."""

from __future__ import annotations

import pytest

from tidegate import ConfigError, Settings, WorkloopSpec, parse_chain, parse_workloops
from tidegate.lanes import DEFAULT_CHAIN, chain_admits, chain_or_default
from tidegate.limits import SETTING_BOUNDS


def test_filter_chain_keeps_order_and_admits_only_named_lanes() -> None:
    chain = parse_chain("fast_lane>manual")
    assert chain == ("fast_lane", "manual")
    assert chain_admits(chain, "manual")
    assert not chain_admits(chain, "default")


def test_preference_chain_with_wildcard_admits_every_lane() -> None:
    chain = parse_chain("manual>*")
    assert chain == ("manual", "*")
    assert chain_admits(chain, "default")
    assert chain_admits(chain, "fast_lane")


def test_chain_from_a_list() -> None:
    assert parse_chain(["a", "b", "*"]) == ("a", "b", "*")


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "at least one lane"),
        ("*>manual", "must be the last"),
        ("manual>*>default", "must be the last"),
        ("man-ual", "must match"),
        ("manual>>default", "must match"),
        ("manual>manual", "appears twice"),
        ("*>*", "must be the last"),
    ],
)
def test_malformed_chain_is_a_clear_error(text: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_chain(text)


@pytest.mark.parametrize("untrusted", ["", "*>manual", "bad lane", "a>a", None, ["x", "*", "y"]])
def test_untrusted_malformed_chain_falls_back_to_default(untrusted: object) -> None:
    assert chain_or_default(untrusted) == DEFAULT_CHAIN  # type: ignore[arg-type]


def test_untrusted_valid_chain_is_kept() -> None:
    assert chain_or_default("fast_lane") == ("fast_lane",)


def test_workloop_spec_parses_groups() -> None:
    loops = parse_workloops("fast_lane:1 manual>*:4")
    assert loops == (
        WorkloopSpec(chain=("fast_lane",), slots=1),
        WorkloopSpec(chain=("manual", "*"), slots=4),
    )
    assert loops[1].named_lanes == ("manual",)
    assert loops[1].wildcard and not loops[0].wildcard
    assert str(loops[1]) == "manual>*:4"


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("", "at least one group"),
        ("manual", "needs a slot count"),
        ("manual:0", "slots must be a whole number from 1 to 10000"),
        ("manual:-1", "slots must be a whole number from 1 to 10000"),
        ("manual:two", "slots must be a whole number from 1 to 10000"),
        ("manual:1.5", "slots must be a whole number from 1 to 10000"),
        ("manual:10001", "slots must be a whole number from 1 to 10000"),
        ("manual:99999999999999999999", "slots must be a whole number from 1 to 10000"),
        ("manual:" + "9" * 5000, "slots must be a whole number from 1 to 10000"),
        ("manual:\u00b2", "slots must be a whole number from 1 to 10000"),
        ("*>manual:2", "'\\*>manual:2'.*must be the last"),
        ("fast-lane:1", "'fast-lane' must match"),
        ("a>a:1", "appears twice"),
        (":3", "at least one lane"),
        ("fast_lane:1 manual>*>x:4", "'manual>\\*>x:4'"),
    ],
)
def test_bad_workloop_spec_names_the_bad_part(spec: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_workloops(spec)


def test_default_settings_have_the_default_workloop() -> None:
    assert Settings().parsed_workloops == (WorkloopSpec(chain=("manual", "*"), slots=10),)


def test_bad_workloop_spec_in_environment_fails_at_start() -> None:
    with pytest.raises(ConfigError, match="slots"):
        Settings.from_env({"TIDEGATE_WORKLOOPS": "manual>*:0"})


def test_settings_read_environment_and_overrides_win() -> None:
    settings = Settings.from_env(
        {"TIDEGATE_LEASE_SECONDS": "12", "TIDEGATE_SCHEMA": "jobs"}, schema="other"
    )
    assert settings.lease_seconds == 12.0
    assert settings.schema == "other"
    with pytest.raises(ConfigError, match="TIDEGATE_LEASE_SECONDS"):
        Settings.from_env({"TIDEGATE_LEASE_SECONDS": "soon"})


@pytest.mark.parametrize("name", sorted(n for n, bound in SETTING_BOUNDS.items() if bound.whole))
def test_every_whole_number_setting_refuses_a_value_past_its_bounds(name: str) -> None:
    low, high = int(SETTING_BOUNDS[name].low), int(SETTING_BOUNDS[name].high)
    Settings(**{name: low})
    Settings(**{name: high})
    for hostile in (low - 1, high + 1, -(2**63)):
        with pytest.raises(ConfigError, match=name):
            Settings(**{name: hostile})


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), 1e12])
def test_the_dashboard_session_length_is_bounded(value: float) -> None:
    with pytest.raises(ConfigError, match="ui_session_seconds"):
        Settings(ui_session_seconds=value)


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"server_url": "http://api:8000"}, "both server_url and worker_token"),
        ({"worker_token": "tgw_x"}, "both server_url and worker_token"),
        ({"server_url": "ftp://api", "worker_token": "tgw_x"}, "http\\(s\\) URL"),
        ({"server_url": "http://a b", "worker_token": "tgw_x"}, "http\\(s\\) URL"),
        ({"server_url": "http://api", "worker_token": "tgw x"}, "worker_token"),
        ({"server_url": "http://api", "worker_token": "tgw_\x00"}, "worker_token"),
    ],
)
def test_a_remote_workers_settings_refuse_a_malformed_server_or_token(
    options: dict[str, str], complaint: str
) -> None:
    Settings(server_url="https://api.internal:8000/base", worker_token="tgw_ok")
    with pytest.raises(ConfigError, match=complaint):
        Settings(**options)  # type: ignore[arg-type]
