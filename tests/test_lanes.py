"""Lane chains and workloop specs: what parses, and how each bad form is refused."""

from __future__ import annotations

import pytest

from tidegate import ConfigError, Settings, WorkloopSpec, parse_chain, parse_workloops
from tidegate.lanes import DEFAULT_CHAIN, Share, chain_admits, chain_or_default, share_demands
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


def test_shares_parse_weights_minimums_and_star() -> None:
    (loop,) = parse_workloops("a=3,b=1/2,*:12")
    assert loop.shares == (Share("a", 3), Share("b", 1, 2), Share("*"))
    assert loop.chain == ("a", "b", "*")
    assert loop.named_lanes == ("a", "b") and loop.wildcard
    assert str(loop) == "a=3,b=1/2,*:12"
    assert parse_workloops(str(loop)) == (loop,)
    (star_first,) = parse_workloops("*=2,fast_lane:4")
    assert star_first.chain == ("fast_lane", "*")  # `*` last in the chain it admits
    assert chain_admits(star_first.chain, "anything")
    (filtered,) = parse_workloops("a,b=2:3")
    assert filtered.shares == (Share("a"), Share("b", 2)) and not filtered.wildcard


def test_chains_keep_parsing_as_chains_beside_shares() -> None:
    chain, shares = parse_workloops("manual>*:4 a=1,b=1:2")
    assert chain == WorkloopSpec(chain=("manual", "*"), slots=4) and not chain.shares
    assert shares.shares == (Share("a"), Share("b"))


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("a=3,b>c:4", "either along a chain .* or by shares .*, not both"),
        ("a>b=1:4", "either along a chain"),
        ("a=0,b:4", "share 'a=0': the weight after '=' must be a whole number from 1 to 1000"),
        ("a=,b:4", "share 'a=': the weight after '='"),
        ("a=1001,b:4", "from 1 to 1000"),
        ("a=x,b:4", "the weight after '='"),
        ("a=1/,b:4", "share 'a=1/': the minimum after '/' must be a whole number of slots"),
        ("a=1/5,b:4", "from 0 to 4"),
        ("a=1/-1,b:4", "the minimum after '/'"),
        ("a=1/2,b=1/3:4", "the minimums add up to 5 slots, more than the workloop's 4"),
        ("a=1,a=2:4", "lane 'a' has two shares"),
        ("*,*=2:4", "lane '\\*' has two shares"),
        ("a=1,,b:4", "lane name '' must match"),
        ("a-b=1,c:4", "lane name 'a-b' must match"),
        ("a=1,b:0", "slots must be a whole number from 1 to 10000"),
        ("a=1,b", "needs a slot count"),
        (",".join(f"l{i}" for i in range(65)) + ":4", "at most 64 lanes may have shares"),
    ],
)
def test_bad_shares_name_the_workloop_and_what_was_wrong(spec: str, complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint) as raised:
        parse_workloops(spec)
    if ":" in spec and not spec.endswith(":0"):
        assert str(raised.value).startswith(f"workloop {spec!r}: ")


def test_bad_shares_in_settings_fail_at_start() -> None:
    with pytest.raises(ConfigError, match="minimums add up"):
        Settings.from_env({"TIDEGATE_WORKLOOPS": "a=1/3,b=1/3:4"})


def split(
    shares: str, free: int, held: list[int] | None = None, dry: frozenset[int] = frozenset()
) -> list[int]:
    """``share_demands`` for ``shares`` in a workloop of the free slots and those held."""
    (loop,) = parse_workloops(f"{shares}:{free + sum(held or [])}")
    return share_demands(loop.shares, held or [0] * len(loop.shares), free, dry)


def test_an_empty_workloop_splits_its_slots_by_minimum_then_weight() -> None:
    assert split("a=3,b=1,c=1/2", 12) == [6, 2, 4]
    assert split("a=3,b=1", 8) == [6, 2]
    assert split("a=1/3,b=1/3,c=100", 6) == [3, 3, 0]  # minimums before any weight
    assert split("a=1/3,b=1/3,c=100", 7) == [3, 3, 1]


def test_a_dry_lanes_share_is_lent_and_comes_back_as_runs_finish() -> None:
    # c has no runs: a and b split all 12 slots 3 to 1.
    assert split("a=3,b=1,c=1/2", 12, dry=frozenset({2})) == [9, 3, 0]
    # c has runs again, and one slot is free: it goes to c (below its minimum), though a
    # and b hold more than their shares; nothing is taken from them.
    assert split("a=3,b=1,c=1/2", 1, held=[8, 3, 0]) == [0, 0, 1]
    # As their runs finish, each freed slot goes to the share furthest behind.
    assert split("a=3,b=1,c=1/2", 3, held=[6, 3, 0]) == [0, 0, 3]
    assert split("a=3,b=1,c=1/2", 2, held=[6, 2, 2]) == [0, 0, 2]


def test_every_share_dry_asks_for_nothing() -> None:
    assert split("a=3,b=1", 5, dry=frozenset({0, 1})) == [0, 0]


def test_a_saturated_workloop_holds_each_share_within_a_slot_of_its_target() -> None:
    """Freeing slots one at a time from any split of a saturated workloop converges to
    the shares, and no freed slot ever takes a share past its target."""
    shares = "a=5,b=3,c=1/1,*=2"
    (loop,) = parse_workloops(f"{shares}:10")
    held = split(shares, 10)
    target = list(held)
    assert target == [4, 2, 2, 2]  # 1 + 9 by 5:3:1:2: 4.09, 2.45, 1 + 0.82, 1.64
    for lane in [0, 1, 1, 2, 3, 0, 0, 2, 1, 3] * 3:  # a run of that share finishes
        held[lane] -= 1
        given = share_demands(loop.shares, held, 1, set())
        held = [h + g for h, g in zip(held, given, strict=True)]
        assert held == target
