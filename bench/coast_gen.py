#!/usr/bin/env python3
"""Real boxes for the benchmarks: GSHHG shoreline segments.

Dumps the shorelines of GSHHG (the Global Self-consistent Hierarchical
High-resolution Geography, shipped by Debian as gmt-gshhg-*) with
`gmt coast -M` and writes one box per pair of consecutive points of a
shoreline, as CSV in bench/compare's table layout:

    id,"(xmax,ymax),(xmin,ymin)",level

in degrees (longitude -180..180, latitude), `level` being GSHHG's (1 ocean
shore, 2 lake shore, 3 island in a lake, 4 pond on such an island).  Rows
follow the shorelines, so an INSERT ... SELECT in id order walks along the
coasts as the Porto data walks along trips.

Unlike the synthetic Porto data, these boxes are small, thin and well
separated: a box meets its two neighbours along the coast (they share an
end point) and little else.  See bench/README.md for the numbers.

    bench/coast_gen.py [--boxes N|all] [--resolution auto|c|l|i|h|f]
                       [--out PATH] [--force] [--stats]

--boxes N (default 220000) takes N segments of the intermediate resolution
(about 415,000 there), or of the first finer one that has N (auto):
whole shoreline pieces, spread evenly over the dump by error diffusion,
the last one cut to make exactly N.  `all` takes every segment of
--resolution (i, the default for `all`).
The result is cached (bench/data/coast-<N>.csv, or coast-<res>-<N>.csv
with an explicit --resolution) and its path printed on stdout; --force writes it again.  Deterministic: the same
GMT and GSHHG packages give the same file.
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'bench', 'data')
RESOLUTIONS = 'clihf'           # crude .. full, GSHHG's order
# auto starts at the intermediate resolution whatever N is, so that fewer
# boxes are a sample of the same shorelines, not coarser ones (a low
# resolution segment is ~4x longer)
AUTO_FROM = 'i'
DEFAULT_BOXES = 220000
# GSHHG's binned files hold coordinates as 16-bit offsets within bins; 1e-7
# degree (1 cm) is finer than any of them, and rounding here makes the
# output independent of how GMT formats its floats
DIGITS = 7


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def dump(res):
    """Shoreline pieces of one resolution: a list of (level, [(x, y), ...])."""
    with tempfile.TemporaryDirectory(prefix='coast_gen.') as tmp:
        # GMT's modern mode keeps a session directory and a gmt.history:
        # both go to a scratch directory, not the caller's
        env = dict(os.environ, GMT_TMPDIR=tmp)
        try:
            r = subprocess.run(['gmt', 'coast', '-Rd', '-D' + res, '-W', '-M'],
                               cwd=tmp, env=env, capture_output=True, text=True)
        except FileNotFoundError:
            raise SystemExit('coast_gen: gmt is not installed (Debian: gmt gmt-gshhg-low; '
                             'bench/compare --data coast installs them)')
    if r.returncode != 0:
        raise RuntimeError('gmt coast -D%s failed (is gmt-gshhg-%s installed?): %s'
                           % (res, 'low' if res in 'cli' else 'high' if res == 'h' else 'full',
                              r.stderr.strip()[-500:]))
    pieces = []
    pts = None
    for line in r.stdout.splitlines():
        if line.startswith('>'):
            m = re.search(r'Level (\d+)', line)
            pts = []
            pieces.append((int(m.group(1)) if m else 0, pts))
            continue
        f = line.split()
        if len(f) >= 2 and pts is not None:
            pts.append((round(float(f[0]), DIGITS), round(float(f[1]), DIGITS)))
    return pieces


def segments(pieces):
    """Per piece, its boxes (xmin, ymin, xmax, ymax); pairs of identical
    points (after rounding) make no box."""
    out = []
    for level, pts in pieces:
        boxes = []
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            if (x0, y0) != (x1, y1):
                boxes.append((min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)))
        if boxes:
            out.append((level, boxes))
    return out


def select(pieces, n):
    """Exactly n boxes: whole pieces, chosen so that the kept count tracks
    n/total of the boxes seen so far (error diffusion), which spreads them
    evenly over the dump (the dump is ordered by GSHHG bin, i.e. by place)
    and keeps each kept shoreline piece contiguous."""
    total = sum(len(b) for _, b in pieces)
    kept, seen, out = 0, 0, []
    for level, boxes in pieces:
        seen += len(boxes)
        if kept < n and kept + len(boxes) / 2 <= seen * n / total:
            take = boxes[:n - kept]
            out.append((level, take))
            kept += len(take)
    # rounding may leave a few short: top up from the pieces passed over
    if kept < n:
        chosen = {id(b) for _, b in out}
        for level, boxes in pieces:
            if kept >= n:
                break
            if id(boxes) not in chosen:
                take = boxes[:n - kept]
                out.append((level, take))
                kept += len(take)
    return out


def overlap_stats(boxes, sample_every=100):
    """Mean number of other boxes that a box meets (&&: closed boxes, so
    touching counts), over every sample_every-th box, with a grid."""
    cell = 0.5
    grid = {}
    for i, (x0, y0, x1, y1) in enumerate(boxes):
        for gx in range(math.floor(x0 / cell), math.floor(x1 / cell) + 1):
            for gy in range(math.floor(y0 / cell), math.floor(y1 / cell) + 1):
                grid.setdefault((gx, gy), []).append(i)
    counts = []
    for i in range(0, len(boxes), sample_every):
        x0, y0, x1, y1 = boxes[i]
        met = set()
        for gx in range(math.floor(x0 / cell), math.floor(x1 / cell) + 1):
            for gy in range(math.floor(y0 / cell), math.floor(y1 / cell) + 1):
                for j in grid.get((gx, gy), ()):
                    a = boxes[j]
                    if j != i and a[0] <= x1 and x0 <= a[2] and a[1] <= y1 and y0 <= a[3]:
                        met.add(j)
        counts.append(len(met))
    return sum(counts) / len(counts), max(counts)


def print_stats(res, available, chosen):
    boxes = [b for _, bs in chosen for b in bs]
    w = sorted(b[2] - b[0] for b in boxes)
    h = sorted(b[3] - b[1] for b in boxes)
    # a degree of longitude shrinks with the cosine of the latitude
    km = sorted(111.32 * math.hypot((b[2] - b[0]) * math.cos(math.radians((b[1] + b[3]) / 2)),
                                    b[3] - b[1]) for b in boxes)

    def q(v, p):
        return v[int(p * (len(v) - 1))]

    levels = {}
    for level, bs in chosen:
        levels[level] = levels.get(level, 0) + len(bs)
    mean_met, max_met = overlap_stats(boxes)
    log('coast_gen: %d boxes from GSHHG resolution %s (%d segments there), %d shoreline pieces'
        % (len(boxes), res, available, len(chosen)))
    log('  extent: x %.2f .. %.2f, y %.2f .. %.2f degrees'
        % (min(b[0] for b in boxes), max(b[2] for b in boxes),
           min(b[1] for b in boxes), max(b[3] for b in boxes)))
    log('  width  (deg): median %.4f  p90 %.4f  p99 %.4f  max %.3f  (zero: %.1f %%)'
        % (q(w, .5), q(w, .9), q(w, .99), w[-1], 100 * sum(1 for x in w if x == 0) / len(w)))
    log('  height (deg): median %.4f  p90 %.4f  p99 %.4f  max %.3f  (zero: %.1f %%)'
        % (q(h, .5), q(h, .9), q(h, .99), h[-1], 100 * sum(1 for x in h if x == 0) / len(h)))
    log('  segment length (km): median %.2f  p90 %.2f  p99 %.2f' % (q(km, .5), q(km, .9), q(km, .99)))
    log('  levels: %s' % ', '.join('%d: %d' % kv for kv in sorted(levels.items())))
    log('  a box meets %.2f other boxes on average (max %d; 2 are its neighbours along the coast)'
        % (mean_met, max_met))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--boxes', default=str(DEFAULT_BOXES), help="N or 'all'")
    p.add_argument('--resolution', default='auto', choices=['auto'] + list(RESOLUTIONS))
    p.add_argument('--out', help='default: bench/data/coast-<N>.csv (coast-<res>-<N>.csv with --resolution)')
    p.add_argument('--force', action='store_true', help='write the file even if it exists')
    p.add_argument('--stats', action='store_true', help='print the data shape (also when cached)')
    args = p.parse_args()
    want_all = args.boxes == 'all'
    n = None if want_all else int(args.boxes)
    if n is not None and n <= 0:
        p.error('--boxes must be positive')

    res = args.resolution
    if res == 'auto' and want_all:
        res = 'i'
    # the cache: auto chooses its resolution deterministically from N, so
    # its file is named by N alone
    out = args.out or os.path.join(
        DATA, 'coast-%s.csv' % args.boxes if res == 'auto' else 'coast-%s-%s.csv' % (res, args.boxes))
    if os.path.exists(out) and not args.force and not args.stats:
        print(out)
        return

    if res == 'auto':
        for r in RESOLUTIONS[RESOLUTIONS.index(AUTO_FROM):]:
            pieces = segments(dump(r))
            total = sum(len(b) for _, b in pieces)
            if total >= n:
                res = r
                break
            log('coast_gen: resolution %s has %d segments, fewer than %d' % (r, total, n))
        else:
            raise SystemExit('coast_gen: no installed GSHHG resolution has %d segments' % n)
    else:
        pieces = segments(dump(res))
    total = sum(len(b) for _, b in pieces)
    if want_all:
        n = total
    elif n > total:
        raise SystemExit('coast_gen: resolution %s has %d segments, fewer than %d'
                         % (res, total, n))
    chosen = pieces if n == total else select(pieces, n)

    if args.stats:
        print_stats(res, total, chosen)
    if not os.path.exists(out) or args.force:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        tmp = out + '.tmp'
        with open(tmp, 'w') as f:
            i = 0
            fmt = '%d,"(%.{0}f,%.{0}f),(%.{0}f,%.{0}f)",%d\n'.format(DIGITS)
            for level, boxes in chosen:
                for x0, y0, x1, y1 in boxes:
                    i += 1
                    f.write(fmt % (i, x1, y1, x0, y0, level))
        os.replace(tmp, out)
        log('coast_gen: wrote %d boxes to %s' % (n, out))
    print(out)


if __name__ == '__main__':
    main()
