#!/usr/bin/env python3
"""Reads the call stacks of scripts/profile-wasm's recording (`perf script -F ip,sym` of
perf.data recorded with -g, wasmtime's perf map naming the plugins' functions) and says where
the plugins' time goes by call graph, which the flat summary (summarize.py) cannot:

  callgraph.py STACKS --plugins          each plugin's share (chain and fused apart), and per
                                         plugin the functions under it, inclusive
  callgraph.py STACKS --callers NAME     who calls the functions whose name contains NAME
                                         (allocator and formatting frames skipped), by share
  callgraph.py STACKS --under NAME       the functions under the outermost frame containing
                                         NAME (e.g. a trait method of one plugin), inclusive

Shares are of the samples taken inside a wasm callback (a frame `proxy_on_*`), so the harness's
own work is left out. Used by scripts/profile-wasm; not part of scripts/test."""
import argparse
import collections
import re
import sys

from summarize import demangle

PLUGINS = ("key_auth", "model_router", "pii_redaction", "usage_accounting", "token_ratelimit")
# frames that say nothing about who asked: the allocator, formatting, vector growth
PLUMBING = re.compile(
    r"rust_alloc|rdl_alloc|^malloc$|^free$|rust_dealloc|rdl_dealloc|rdl_realloc|rust_realloc"
    r"|^realloc$|dlmalloc|dlfree|finish_grow|grow_one|format_inner|fmt::write|fmt::format"
    r"|drop_in_place|reserve|RawVec"
)


def stacks(path):
    """Each sample's frames, innermost first, names demangled."""
    frames = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                if frames:
                    yield frames
                frames = []
                continue
            parts = line.split(None, 1)
            frames.append(demangle(parts[1].split("+")[0]) if len(parts) > 1 else "?")
    if frames:
        yield frames


def owner(frames):
    """The plugin whose code the sample is in (its outermost frame of a plugin crate), and
    whether it ran in the fused filter."""
    fused = any(f.startswith("llm_gateway_bundle::") or "llm_gateway_bundle::" in f for f in frames)
    for f in reversed(frames):
        m = re.match(r"_?<?(\w+)::", f)
        if m and m.group(1) in PLUGINS:
            return m.group(1), fused
    return "other", fused


def inclusive(samples, top):
    counts = collections.Counter()
    for frames in samples:
        for name in set(frames):
            counts[name] += 1
    return counts.most_common(top)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stacks")
    parser.add_argument("--plugins", action="store_true")
    parser.add_argument("--callers")
    parser.add_argument("--under")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    wasm = [s for s in stacks(args.stacks) if any(f.startswith("proxy_on_") for f in s)]
    if not wasm:
        sys.exit("callgraph.py: no sample inside a wasm callback (recorded without -g?)")
    total = len(wasm)
    print(f"{total} samples inside wasm callbacks")
    if args.plugins:
        by = collections.defaultdict(list)
        for frames in wasm:
            by[owner(frames)].append(frames)
        for (plugin, fused), samples in sorted(by.items(), key=lambda kv: -len(kv[1])):
            form = "fused" if fused else "chain"
            print(f"\n{100 * len(samples) / total:6.2f}%  {plugin} ({form})")
            for name, n in inclusive(samples, args.top):
                if name.startswith(("proxy_on_", "wasm[", "llm_gateway_tests::", "[unknown]")):
                    continue
                print(f"    {100 * n / total:6.2f}%  {name[:150]}")
    if args.callers:
        callers = collections.Counter()
        hits = 0
        for frames in wasm:
            at = next((i for i, f in enumerate(frames) if args.callers in f), None)
            if at is None:
                continue
            hits += 1
            outer = [f for f in frames[at + 1:] if not PLUMBING.search(f)][:2]
            callers[" <- ".join(f[:110] for f in outer)] += 1
        print(f"\n{100 * hits / total:.2f}%  under a frame containing {args.callers!r}, by caller:")
        for chain, n in callers.most_common(args.top):
            print(f"    {100 * n / total:6.2f}%  {chain}")
    if args.under:
        samples = []
        for frames in wasm:
            at = [i for i, f in enumerate(frames) if args.under in f]
            if at:
                samples.append(frames[: max(at)])
        print(f"\n{100 * len(samples) / total:.2f}%  under {args.under!r}:")
        for name, n in inclusive(samples, args.top):
            print(f"    {100 * n / total:6.2f}%  {name[:150]}")


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
