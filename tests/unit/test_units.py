"""Tests for kveval.inputs.units: byte-size parsing and formatting."""

from __future__ import annotations

import pytest

from kveval.inputs.units import parse_size

MiB = 1024**2
GiB = 1024**3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("150MiB", 150 * MiB),
        ("150 MiB", 150 * MiB),
        ("150mib", 150 * MiB),
        ("1.5GiB", 1536 * MiB),
        ("200MB", 200_000_000),
        ("200mb", 200_000_000),
        ("2G", 2 * GiB),
        ("2g", 2 * GiB),
        ("1024", 1024),
        ("512k", 512 * 1024),
        ("512KiB", 512 * 1024),
        ("512KB", 512_000),
        ("1.1MB", 1_100_000),
        ("3GB", 3_000_000_000),
        ("1TiB", 1024**4),
        ("100B", 100),
        ("  64 M  ", 64 * MiB),
        (".5GiB", 512 * MiB),
        (157286400, 157286400),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "abc", "MiB", "1.5.2G", "10 parsecs", "5XB", "-5MiB", "-1", "0", "0GiB", "0.0001", 0, -3, True]
)
def test_parse_size_rejects(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_parse_size_messages_are_clear() -> None:
    with pytest.raises(ValueError, match="invalid size 'lots'.*150MiB"):
        parse_size("lots")
    with pytest.raises(ValueError, match="positive"):
        parse_size("-150MiB")
    with pytest.raises(ValueError, match="positive"):
        parse_size("0")
