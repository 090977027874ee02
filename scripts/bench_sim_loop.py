"""The cost of one event on pserver-sim's two event loops (``sim.loop``: heap or simpy).

``python scripts/bench_sim_loop.py [--events N] [--chains K] [--repeats R]`` runs K chains of
callbacks, each scheduling the next at a pseudo-random delay, N events in all, on each loop in
turn, R times, and prints the best µs per event of each and their ratio (docs/simulation.md,
*Event loop*). The callback does nothing else, so the figure is the loop's own overhead.
"""

from __future__ import annotations

import argparse
import time

from pserver.sim.loop import HeapLoop, SimpyLoop


def chain(loop: HeapLoop | SimpyLoop, left: list[int], k: int) -> None:
    if left[0] > 0:
        left[0] -= 1
        loop.after(((k * 2654435761) % 1000) * 1e-6 + 1e-6, chain, loop, left, k + 1)


def per_event(make: type, events: int, chains: int) -> float:
    loop = make()
    left = [events - chains]
    for k in range(chains):
        loop.after(0.0, chain, loop, left, k)
    t = time.perf_counter()
    loop.run()
    return (time.perf_counter() - t) / loop.events * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=500_000)
    ap.add_argument("--chains", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    best = {"heap": float("inf"), "simpy": float("inf")}
    for _ in range(a.repeats):
        for name, make in (("heap", HeapLoop), ("simpy", SimpyLoop)):
            best[name] = min(best[name], per_event(make, a.events, a.chains))
    print(f"{a.events} events, {a.chains} chains, best of {a.repeats}: heap "
          f"{best['heap']:.2f} µs/event, simpy {best['simpy']:.2f} µs/event, simpy/heap "
          f"{best['simpy'] / best['heap']:.2f}")


if __name__ == "__main__":
    main()
