#!/usr/bin/env python3
"""Compare a generated Porto-like MBR file with the Porto taxi sample.

Usage: python3 bench/calibrate.py GENERATED.txt [SAMPLE.txt]

Both files are in the txt format "xmin ymin tmin xmax ymax tmax" (longitude,
latitude, time/1e4 s), as written by `bench/porto_gen --format txt`.  Prints a
side-by-side table of statistics and checks the ones the benchmark depends
on.

SAMPLE defaults to bench/data/porto_taxi_mbr_sample.txt next to this script,
then /work/shared/data/porto_taxi_mbr_sample.txt.

Definitions (applied identically to both files):
  * step box: a box whose time span equals the 15 s GPS step (0.0015 in
    time/1e4 units, compared to within 0.5 s since times have 1 s
    resolution).
  * trip-joining box: a box whose time span is NOT the 15 s step.  Within a
    trip consecutive fixes are always 15 s apart; the box joining the last
    fix of one trip to the first fix of the next spans the (arbitrary) gap
    between the two trips' times.  Note that a joining box still shares a
    corner with its neighbours - it contains the previous trip's last fix
    and the next trip's first fix - so "start corner differs from the
    previous end fix" does not detect joins in the real data; the table
    reports that count separately as "corner-chain breaks" (expected 0).
  * near-degenerate box: width < 1e-5 deg and height < 1e-5 deg (a stopped
    taxi).
  * percentiles use linear interpolation between order statistics.

Exit status: 0 if the checks pass; 1 if the generated median width or
height is outside +-25% of the sample's, or the generated trip-joining
fraction is outside 1%..4%; 2 on usage errors or unreadable input.
"""

import os
import sys

STEP = 0.0015           # 15 s in time/1e4 units
STEP_TOL = 0.00005      # half a second
DEGEN = 1e-5
MEDIAN_TOL = 0.25
JOIN_MIN, JOIN_MAX = 0.01, 0.04

SCRIPT_DIR = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SAMPLES = [
    os.path.join(SCRIPT_DIR, "data", "porto_taxi_mbr_sample.txt"),
    "/work/shared/data/porto_taxi_mbr_sample.txt",
]


class InputError(Exception):
    pass


def percentile(sorted_vals, p):
    """Percentile p in [0, 1] of an already sorted list (linear interp.)."""
    n = len(sorted_vals)
    if n == 0:
        return float("nan")
    pos = p * (n - 1)
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * frac


def corners(xmin, ymin, xmax, ymax):
    return {(xmin, ymin), (xmin, ymax), (xmax, ymin), (xmax, ymax)}


def analyse(path):
    """Read one txt file and return a dict of statistics."""
    widths, heights, xmins, ymins = [], [], [], []
    n = steps = joins = degen = chain_breaks = 0
    xlo = ylo = tlo = float("inf")
    xhi = yhi = thi = float("-inf")
    prev_corners = None
    try:
        f = open(path, "r")
    except OSError as e:
        raise InputError("cannot read %s: %s" % (path, e.strerror))
    with f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise InputError("%s:%d: expected 6 columns, got %d"
                                 % (path, lineno, len(parts)))
            try:
                xmin, ymin, tmin, xmax, ymax, tmax = map(float, parts)
            except ValueError:
                raise InputError("%s:%d: not a number" % (path, lineno))
            if xmin > xmax or ymin > ymax or tmin > tmax:
                raise InputError("%s:%d: min > max" % (path, lineno))
            n += 1
            w, h = xmax - xmin, ymax - ymin
            widths.append(w)
            heights.append(h)
            xmins.append(xmin)
            ymins.append(ymin)
            xlo, xhi = min(xlo, xmin), max(xhi, xmax)
            ylo, yhi = min(ylo, ymin), max(yhi, ymax)
            tlo, thi = min(tlo, tmin), max(thi, tmax)
            if abs((tmax - tmin) - STEP) <= STEP_TOL:
                steps += 1
            else:
                joins += 1
            if w < DEGEN and h < DEGEN:
                degen += 1
            # Exact float comparison is intended: both boxes print the
            # shared fix with the same digits.
            c = corners(xmin, ymin, xmax, ymax)
            if prev_corners is not None and not (c & prev_corners):
                chain_breaks += 1
            prev_corners = c
    if n == 0:
        raise InputError("%s: no boxes" % path)
    for v in (widths, heights, xmins, ymins):
        v.sort()
    return {
        "rows": n,
        "x": (xlo, xhi), "y": (ylo, yhi), "t": (tlo, thi),
        "w": [percentile(widths, p) for p in (0.5, 0.1, 0.9)],
        "h": [percentile(heights, p) for p in (0.5, 0.1, 0.9)],
        "xq": [percentile(xmins, p) for p in (0.05, 0.5, 0.95)],
        "yq": [percentile(ymins, p) for p in (0.05, 0.5, 0.95)],
        "step_frac": steps / n,
        "join_frac": joins / n,
        "degen_frac": degen / n,
        "boxes_per_trip": n / joins if joins else float("inf"),
        "chain_breaks": chain_breaks,
    }


def fmt_range(r, digits):
    return "%.*f .. %.*f" % (digits, r[0], digits, r[1])


def print_table(gen, smp, gen_path, smp_path):
    rows = [
        ("rows", "%d" % gen["rows"], "%d" % smp["rows"]),
        ("x range", fmt_range(gen["x"], 4), fmt_range(smp["x"], 4)),
        ("y range", fmt_range(gen["y"], 4), fmt_range(smp["y"], 4)),
        ("t range", fmt_range(gen["t"], 4), fmt_range(smp["t"], 4)),
        ("xmin p5/p50/p95", "/".join("%.4f" % v for v in gen["xq"]),
         "/".join("%.4f" % v for v in smp["xq"])),
        ("ymin p5/p50/p95", "/".join("%.4f" % v for v in gen["yq"]),
         "/".join("%.4f" % v for v in smp["yq"])),
    ]
    for key, label in (("w", "width"), ("h", "height")):
        for i, p in enumerate(("median", "p10", "p90")):
            rows.append(("%s %s" % (label, p), "%.6f" % gen[key][i],
                         "%.6f" % smp[key][i]))
    rows += [
        ("15 s step fraction", "%.4f" % gen["step_frac"],
         "%.4f" % smp["step_frac"]),
        ("trip-join fraction", "%.4f" % gen["join_frac"],
         "%.4f" % smp["join_frac"]),
        ("boxes per trip", "%.1f" % gen["boxes_per_trip"],
         "%.1f" % smp["boxes_per_trip"]),
        ("near-degenerate frac", "%.4f" % gen["degen_frac"],
         "%.4f" % smp["degen_frac"]),
        ("corner-chain breaks", "%d" % gen["chain_breaks"],
         "%d" % smp["chain_breaks"]),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(max(len(r[1]) for r in rows), len("generated"))
    print("generated: %s" % gen_path)
    print("sample:    %s" % smp_path)
    print("%-*s  %-*s  %s" % (w0, "statistic", w1, "generated", "sample"))
    print("%s  %s  %s" % ("-" * w0, "-" * w1, "-" * 24))
    for name, g, s in rows:
        print("%-*s  %-*s  %s" % (w0, name, w1, g, s))


def check(gen, smp):
    """Return a list of failure messages (empty if all checks pass)."""
    failures = []
    for key, label in (("w", "median width"), ("h", "median height")):
        g, s = gen[key][0], smp[key][0]
        if s == 0 or abs(g - s) / s > MEDIAN_TOL:
            failures.append("%s %.6f is outside +-%d%% of the sample's %.6f"
                            % (label, g, MEDIAN_TOL * 100, s))
    if not JOIN_MIN <= gen["join_frac"] <= JOIN_MAX:
        failures.append("trip-join fraction %.4f is outside %.2f..%.2f"
                        % (gen["join_frac"], JOIN_MIN, JOIN_MAX))
    return failures


def main(argv):
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        sys.stderr.write("usage: python3 %s GENERATED.txt [SAMPLE.txt]\n"
                         % os.path.relpath(__file__))
        return 2
    gen_path = argv[1]
    if len(argv) == 3:
        smp_path = argv[2]
        if not os.path.isfile(smp_path):
            sys.stderr.write("calibrate: sample file %s does not exist\n"
                             % smp_path)
            return 2
    else:
        smp_path = next((p for p in DEFAULT_SAMPLES if os.path.isfile(p)),
                        None)
        if smp_path is None:
            sys.stderr.write(
                "calibrate: Porto sample not found; looked in:\n  %s\n"
                "pass its path as the second argument\n"
                % "\n  ".join(DEFAULT_SAMPLES))
            return 2
    try:
        gen = analyse(gen_path)
        smp = analyse(smp_path)
    except InputError as e:
        sys.stderr.write("calibrate: %s\n" % e)
        return 2

    print_table(gen, smp, gen_path, smp_path)
    failures = check(gen, smp)
    print()
    if failures:
        for msg in failures:
            print("FAIL: %s" % msg)
        return 1
    print("PASS: median width/height within +-%d%% of the sample, "
          "trip-join fraction within %.0f%%..%.0f%%"
          % (MEDIAN_TOL * 100, JOIN_MIN * 100, JOIN_MAX * 100))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
