"""Prime factorisation of 64-bit integers, and the divisors read from it.

The mapping counts come from divisor lattices (tp | N, pp | blocks, microbatch | batch/dp),
so every count starts from the divisors of a few integers. Trial division up to √n hangs
on a 64-bit GPU count (2^63 − 1 would take ~3·10^9 divisions); factorising takes a
millisecond: trial division by the primes below TRIAL_LIMIT, then a deterministic
Miller–Rabin test and Pollard's rho (Brent's variant) on what is left.
"""

from __future__ import annotations

import math
from functools import lru_cache

TRIAL_LIMIT = 1 << 11
"""Primes below 2048 are divided out directly; what remains has only factors >= 2048."""
MAX_FACTORABLE = (1 << 64) - 1
"""Miller–Rabin with MR_BASES is deterministic below 2^64 (Sorenson & Webster 2015 prove the
first 12 primes suffice up to 3.3·10^24); larger integers are refused, not guessed."""
MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def _small_primes(limit: int) -> tuple[int, ...]:
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(limit) + 1):
        if sieve[p]:
            sieve[p * p::p] = bytearray(len(range(p * p, limit, p)))
    return tuple(i for i, is_prime in enumerate(sieve) if is_prime)


_PRIMES = _small_primes(TRIAL_LIMIT)


def is_prime(n: int) -> bool:
    """Deterministic for n < 2^64 (Miller–Rabin with the first twelve primes as bases)."""
    if n < 2:
        return False
    for p in MR_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite n (Pollard's rho, Brent's cycle finding)."""
    for c in range(1, n):
        y, m, g, r, q = 2, 128, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = math.gcd(q, n)
                k += m
            r *= 2
        if g == n:  # the batch overshot: step back one at a time
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = math.gcd(abs(x - ys), n)
        if g != n:
            return g
    raise ArithmeticError(f"no factor found for {n}")  # not reached for composite n


@lru_cache(maxsize=1024)
def factorise(n: int) -> tuple[tuple[int, int], ...]:
    """(prime, exponent) pairs of n >= 1, primes ascending."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"factorise: {n!r} is not a positive integer")
    if n > MAX_FACTORABLE:
        raise ValueError(f"factorise: {n} is above 2^64 - 1")
    found: dict[int, int] = {}
    for p in _PRIMES:
        if p * p > n:
            break
        while n % p == 0:
            found[p] = found.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if m < TRIAL_LIMIT * TRIAL_LIMIT or is_prime(m):  # no factor < TRIAL_LIMIT is left
            found[m] = found.get(m, 0) + 1
            continue
        d = _rho(m)
        stack += [d, m // d]
    return tuple(sorted(found.items()))


@lru_cache(maxsize=4096)
def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n (1 <= n < 2^64), ascending, from its factorisation."""
    out = [1]
    for prime, exponent in factorise(n):
        out = [d * prime**k for d in out for k in range(exponent + 1)]
    return tuple(sorted(out))
