"""Hostile mail shared by the unit and integration tiers."""

from __future__ import annotations

HEAD = b"From: a@example.com\r\nTo: b@example.com\r\nMIME-Version: 1.0\r\n"


def slow_part_lines(count: int) -> bytes:
    """`count` parts of boundary `B` within the bounds that each cost the
    stdlib a header parse of their own (distinct parameters): 60-140 ms of
    CPU at 90, far past a 1 ms budget even where the CPU timer advances by
    whole scheduler ticks. No closing delimiter."""
    params = b"".join(b'; p%d="value-%d"' % (k, k) for k in range(12))
    return b"".join(
        b'--B\r\nContent-Type: text/plain; charset=utf-8; name="part-%d"' % i
        + params
        + b'\r\nContent-Disposition: inline; filename="p%d.txt"' % i
        + params
        + b"\r\n\r\npart %d\r\n" % i
        for i in range(count)
    )


def slow_parts(count: int) -> bytes:
    """A whole message of :func:`slow_part_lines`."""
    return (
        HEAD
        + b"Subject: many parts\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
        + slow_part_lines(count)
        + b"--B--\r\n"
    )
