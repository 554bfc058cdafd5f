#!/usr/bin/env python3
"""Reads `perf report --sort sym --stdio` of the harness's JIT code on stdin; prints each wasm
function's share of the plugins' code, names demangled and the same function of different
modules (the chain's, the fused filter's) summed. Used by scripts/profile-wasm."""
import collections
import re
import sys

ESCAPES = (("$LT$", "<"), ("$GT$", ">"), ("$u20$", " "), ("$RF$", "&"), ("$BP$", "*"),
           ("$C$", ","), ("$u7b$", "{"), ("$u7d$", "}"), ("$u5b$", "["), ("$u5d$", "]"),
           ("..", "::"))


def demangle(sym: str) -> str:
    m = re.match(r"_ZN(.*)E$", sym)
    if not m:
        return sym
    rest, parts = m.group(1), []
    while rest and rest[0].isdigit():
        n = re.match(r"\d+", rest).group(0)
        rest = rest[len(n):]
        parts.append(rest[: int(n)])
        rest = rest[int(n):]
    if parts and re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    name = "::".join(parts)
    for a, b in ESCAPES:
        name = name.replace(a, b)
    return name


def main() -> None:
    total = collections.Counter()
    for line in sys.stdin:
        m = re.match(r"\s*([0-9.]+)%\s+\[\.\]\s+(\S+)", line)
        if m:
            total[demangle(m.group(2))] += float(m.group(1))
    whole = sum(total.values()) or 1.0
    print(f"share of the plugins' code (their samples: {whole:.2f}% of the process)")
    for name, pct in total.most_common():
        print(f"{100 * pct / whole:6.2f}%  {name}")


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
