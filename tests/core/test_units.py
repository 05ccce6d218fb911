"""Tests for FfDL size and duration strings (ffdl.core.units)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ffdl.core.errors import ManifestError
from ffdl.core.units import MAX_SIZE_MB, describe_value, parse_duration_s, parse_size_mb

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("value", "expected_mb"),
    [
        ("512", 512),
        (512, 512),
        (1.5, 2),
        ("1.5", 2),
        ("1Gb", 954),  # decimal: 10^9 bytes = 953.67 MiB, rounded up
        ("1GB", 954),
        ("1gb", 954),
        ("2Gb", 1908),
        ("1.5Gb", 1431),
        ("16GB", 15259),
        ("10Gb", 9537),
        ("4G", 3815),
        (" 8Gb ", 7630),
        ("100mb", 96),
        ("3M", 3),
        ("1tb", 953675),
        ("512kb", 1),
        ("1k", 1),
        ("1000MiB", 1000),
        ("300MiB", 300),
        ("2gib", 2048),
        ("0.5GiB", 512),
        ("32GiB", 32768),
        ("1TiB", 1048576),
        ("2048KiB", 2),
        ("1 Gi", 1024),
        ("256Mi", 256),
    ],
)
def test_parse_size_mb_units_table(value: str | int | float, expected_mb: int) -> None:
    assert parse_size_mb(value, "memory") == expected_mb


@pytest.mark.parametrize(
    "value",
    ["", "   ", "Gb", "-1Gb", "-5", "0", "0Gb", "0.0", 0, -5, 0.0, -0.5, "1.2.3Gb", "1e3Mb", "Gb1"],
)
def test_parse_size_mb_rejects_non_positive_or_malformed(value: str | int | float) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_size_mb(value, "storage")
    assert caught.value.field == "storage"
    assert caught.value.code == "C104"


@pytest.mark.parametrize("value", [True, False, None, [1], {"gb": 1}, math.inf, math.nan])
def test_parse_size_mb_rejects_other_types(value: object) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_size_mb(value, "memory")  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.code) == ("memory", "C104")


def test_unknown_size_unit_is_named_with_the_accepted_units() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_size_mb("8Gx", "memory")
    assert caught.value.reason == "unknown size unit 'Gx' (use mb, mib, gb, gib, tb, tib)"
    assert caught.value.message == (
        "invalid manifest: memory: unknown size unit 'Gx' (use mb, mib, gb, gib, tb, tib)"
    )


def test_unknown_unit_keeps_the_users_spelling() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_size_mb("10 PB", "storage")
    assert caught.value.reason.startswith("unknown size unit 'PB'")


def test_absurdly_large_sizes_are_rejected() -> None:
    assert parse_size_mb(f"{MAX_SIZE_MB}MiB", "memory") == MAX_SIZE_MB
    with pytest.raises(ManifestError, match="too large"):
        parse_size_mb(f"{MAX_SIZE_MB + 1}MiB", "memory")
    with pytest.raises(ManifestError, match="too large"):
        parse_size_mb(1e300, "memory")
    with pytest.raises(ManifestError):
        parse_size_mb("9" * 5000 + "Gb", "memory")


@given(st.integers(min_value=1, max_value=10**9))
def test_binary_mib_round_trips(size_mb: int) -> None:
    assert parse_size_mb(f"{size_mb}MiB", "memory") == size_mb
    assert parse_size_mb(str(size_mb), "memory") == size_mb
    assert parse_size_mb(size_mb, "memory") == size_mb


@given(st.integers(min_value=1, max_value=10**5), st.sampled_from(["GiB", "gib", "Gi"]))
def test_binary_gib_is_1024_mib(size_gib: int, suffix: str) -> None:
    assert parse_size_mb(f"{size_gib}{suffix}", "memory") == size_gib * 1024


@given(st.integers(min_value=1, max_value=10**9), st.sampled_from(["MB", "mb", "M"]))
def test_decimal_megabytes_round_up_to_whole_mib(megabytes: int, suffix: str) -> None:
    size_mb = parse_size_mb(f"{megabytes}{suffix}", "memory")
    size_bytes = megabytes * 10**6
    assert (size_mb - 1) * MIB < size_bytes <= size_mb * MIB


@given(st.integers(min_value=1, max_value=10**6), st.integers(min_value=1, max_value=10**6))
def test_sizes_are_monotonic(first_gb: int, second_gb: int) -> None:
    smaller, larger = sorted((first_gb, second_gb))
    assert parse_size_mb(f"{smaller}Gb", "memory") <= parse_size_mb(f"{larger}Gb", "memory")


@pytest.mark.parametrize(
    ("value", "expected_s"),
    [
        (90, 90.0),
        (0.5, 0.5),
        ("90", 90.0),
        ("2.5", 2.5),
        ("90s", 90.0),
        ("30m", 1800.0),
        ("2h", 7200.0),
        ("2H", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("1h 30m", 5400.0),
        ("1d2h3m4s", 86400.0 + 7200 + 180 + 4),
    ],
)
def test_parse_duration_s_table(value: str | int | float, expected_s: float) -> None:
    assert parse_duration_s(value, "expected_duration") == pytest.approx(expected_s)


@pytest.mark.parametrize(
    "value",
    ["", "soon", "1x", "h", "-5m", "30m1h", "1h1h", "0s", 0, -1, math.nan, math.inf, True, None],
)
def test_parse_duration_s_rejects(value: object) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_duration_s(value, "expected_duration")  # type: ignore[arg-type]
    assert (caught.value.field, caught.value.code) == ("expected_duration", "C101")


def test_durations_over_ten_years_are_rejected() -> None:
    with pytest.raises(ManifestError, match="too long"):
        parse_duration_s("4000d", "expected_duration")


@given(
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=0, max_value=59),
    st.integers(min_value=1, max_value=59),
)
def test_compound_durations_add_up(hours: int, minutes: int, seconds: int) -> None:
    text = f"{hours}h{minutes}m{seconds}s"
    assert parse_duration_s(text, "d") == hours * 3600 + minutes * 60 + seconds


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (True, "true"),
        (None, "null"),
        ("two", "'two'"),
        (1.5, "1.5"),
        ({"a": 1}, "a mapping"),
        ([1, 2], "a list"),
        ("x" * 100, "'" + "x" * 36 + "..."),
    ],
)
def test_describe_value_uses_yaml_words(value: object, shown: str) -> None:
    assert describe_value(value) == shown
