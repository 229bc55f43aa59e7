#!/usr/bin/env python3
"""amrtree sliding-window benchmark: index size, VACUUM and INSERT time as
rows drift across space, against GiST on the same rows.

    window.py --workdir W --results R window [--quick] [options]

Run through the wrapper bench/window, which installs the dependencies,
builds and installs amrtree, and runs this file as the unprivileged
PostgreSQL user.  The cluster and the measurements come from
bench/amrbench.py's helpers.

The workload is t/046_vacuum_free_leaves.pl's: step s adds 2,000 small
boxes (x in [s, s + 1), y in [0, 1), sides up to 0.002), deletes the rows
of step s - 11 and older (a window of 11 steps, 22,000 rows), and runs
VACUUM (INDEX_CLEANUP on).  Every row is written once, into a staging
table, and copied from there into one table per configuration, so that the
tables hold the same rows with the same ids:

  amrtree                        amrtree, default options (VACUUM frees the
                                 leaves it empties, free_empty_leaves = on)
  amrtree free_empty_leaves=off  the behaviour before VACUUM freed leaves:
                                 the emptied leaves stay in the tree
  gist                           GiST (box_ops)
  no index                       the primary key only: what VACUUM, INSERT
                                 and DELETE cost without a box index, so
                                 that an index's own share can be told apart

Within a step the configurations take turns, each step starting with
another one, so that none always runs right after the same neighbour.
The window is filled with steps 0 .. 10 first and the indexes are built on
it; the N measured steps follow.  After the last step every index is
checked to return what a sequential scan returns (index and bitmap scans,
&&, @> and <@, windows over the live rows and over the deleted ones), and
pgbench runs range queries over the final window.

One cluster for the whole run, by default in amrtree's default
configuration: the pool a file in the data directory, synchronous_commit
on.  Timings on a shared 2-core machine are noisy; the sizes are not.
"""

import datetime
import json
import os
import re
import statistics
import sys
import time

sys.dont_write_bytecode = True          # run as another user: no __pycache__ in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amrbench as ab                   # noqa: E402
from amrbench import log                # noqa: E402

# name, table, method (for ab.index_bytes; None: no box index), WITH options
CONFIGS = [
    ('amrtree', 'w_amrtree', 'amrtree', ''),
    ('amrtree free_empty_leaves=off', 'w_keep', 'amrtree', 'free_empty_leaves = off'),
    ('gist', 'w_gist', 'gist', ''),
    ('no index', 'w_none', None, ''),
]
INDEXED = [c for c in CONFIGS if c[2]]
SHORT = {'amrtree': 'amrtree', 'amrtree free_empty_leaves=off': 'amrtree-keep',
         'gist': 'GiST', 'no index': 'no index'}

WINDOW_STEPS = 11           # steps alive at once: rows of step <= s - 11 are deleted
ROWS_PER_STEP = 2000
BOX_SIDE = 0.002            # a box's sides are uniform in [0, BOX_SIDE)
# pgbench windows (half-sizes; square): about one row, and about twenty
QUERY_HALF_SIZES = [0.005, 0.05]


def timed_each(cl, statements):
    """Run statements in one session; the server round-trip time of each, in
    seconds (psql \\timing prints one line per statement)."""
    out = cl.sql('\\timing on\n' + '\n'.join(s + ';' for s in statements))
    ms = [float(m) for m in re.findall(r'Time: ([0-9.]+) ms', out)]
    if len(ms) != len(statements):
        raise RuntimeError('expected %d timings, got %d:\n%s' % (len(statements), len(ms), out))
    return [m / 1000.0 for m in ms]


def stage_step(cl, s):
    """Step s's rows into the staging table.  The seed depends on the step
    only, so that a step's boxes are the same from run to run."""
    seed = (s * 0.6180339887) % 1.0
    cl.sql(f"""
TRUNCATE step_src;
SELECT setseed({seed!r});
INSERT INTO step_src (id, step, b)
SELECT nextval('w_ids'), {s}, box(point(x, y), point(x + random() * {BOX_SIDE}, y + random() * {BOX_SIDE}))
FROM (SELECT {s} + random() AS x, random() AS y FROM generate_series(1, {ROWS_PER_STEP})) g""")


def sizes(cl, method, table):
    """Index size as bench/compare measures it (amrtree: DRAM for the inner
    nodes plus its leaves on PMEM and SSD; GiST: the relation's size, free
    pages included), with amrtree's leaf and inner node counts."""
    if method is None:
        return {'total': 0, 'dram': 0, 'pmem': 0, 'ssd': 0, 'leaves': '', 'inner_nodes': ''}
    size = ab.index_bytes(cl, method, table)
    if method == 'amrtree':
        leaves, inner = cl.rows(f"SELECT leaves, inner_nodes FROM amrtree_index_stats('{table}_b')")[0]
        size['leaves'], size['inner_nodes'] = int(leaves), int(inner)
    else:
        size['leaves'], size['inner_nodes'] = '', ''
    return size


def slope(xs, ys):
    """Least-squares slope of ys against xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float('nan')


# ---------------------------------------------------------------- parity

def make_check_windows(cl, lo, hi):
    """Windows over the live steps lo .. hi (t/046's), and over the five
    steps before lo, whose rows were all deleted: an index must not return
    them, nor lose the live rows near the window's trailing edge."""
    cl.sql(f"""
DROP TABLE IF EXISTS check_windows;
CREATE TABLE check_windows (id int PRIMARY KEY, q box);
INSERT INTO check_windows
SELECT i, box(point({lo} + ({hi} - {lo} + 1) * i / 40.0, (i % 7) / 7.0),
              point({lo} + ({hi} - {lo} + 1) * i / 40.0 + 0.03 + (i % 3) * 0.2,
                    (i % 7) / 7.0 + 0.1 + (i % 4) * 0.25))
FROM generate_series(0, 39) i;
INSERT INTO check_windows
SELECT 40 + i, box(point({lo} - 5 + i, 0), point({lo} - 4.5 + i + (i = 4)::int, 1))
FROM generate_series(0, 4) i;
ANALYZE check_windows""")


SCAN_GUCS = {
    'index scan': 'SET enable_seqscan = off; SET enable_bitmapscan = off;',
    'bitmap scan': 'SET enable_seqscan = off; SET enable_indexscan = off; '
                   'SET enable_indexonlyscan = off;',
    'seq scan': 'SET enable_indexscan = off; SET enable_indexonlyscan = off; '
                'SET enable_bitmapscan = off;',
}
PLAN_NODE = {'index scan': 'Index Scan using {t}_b', 'bitmap scan': 'Bitmap Index Scan on {t}_b',
             'seq scan': 'Seq Scan on {t} t'}


def digest_query(table, op):
    return (f"SELECT md5(string_agg(c.id || ':' || coalesce((SELECT array_agg(t.id ORDER BY t.id) "
            f"FROM {table} t WHERE t.b {op} c.q)::text, '{{}}'), ',' ORDER BY c.id)) "
            f"FROM check_windows c")


def check_parity(cl):
    """Every index, by index scan and by bitmap scan, returns what a
    sequential scan of its table returns, which is the same for every table;
    amrtree's entries equal its table's rows.  Raises otherwise."""
    want = {}
    checked = 0
    for op in ('&&', '@>', '<@'):
        for name, table, method, _ in CONFIGS:
            scans = ['seq scan'] + (['index scan', 'bitmap scan'] if method else [])
            for scan in scans:
                q = digest_query(table, op)
                plan = cl.sql(SCAN_GUCS[scan] + '\nEXPLAIN (COSTS OFF) ' + q)
                node = PLAN_NODE[scan].format(t=table)
                if node not in plan:
                    raise RuntimeError('%s, %s %s: the plan has no "%s":\n%s'
                                       % (name, scan, op, node, plan))
                got = cl.sql(SCAN_GUCS[scan] + '\n' + q).splitlines()[-1]
                want.setdefault(op, got)
                if got != want[op]:
                    raise RuntimeError('%s: %s with %s returns other rows than a sequential scan'
                                       % (name, scan, op))
                checked += 1
    nrows = int(cl.sql('SELECT count(*) FROM w_gist'))
    for name, table, method, _ in INDEXED:
        if method == 'amrtree':
            entries = int(cl.sql(f"SELECT entries FROM amrtree_index_stats('{table}_b')"))
            if entries != nrows:
                raise RuntimeError('%s: %d entries for %d rows' % (name, entries, nrows))
    return checked


# ---------------------------------------------------------------- the run

def cmd_window(args):
    quick = args.quick
    steps = args.steps or (60 if quick else 200)
    seconds = args.seconds or (1 if quick else 3)
    rounds = args.rounds or 3
    clients = args.clients
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    outdir = os.path.join(args.results, 'window-' + stamp)
    res = ab.Results(outdir, 'window')
    info = ab.machine_info()
    ab.print_machine(info, [args.config])
    log('window: %d steps of %d rows, a window of %d steps (%d rows); configurations: %s; '
        'pgbench %d round(s) of %d s, %d client(s)'
        % (steps, ROWS_PER_STEP, WINDOW_STEPS, WINDOW_STEPS * ROWS_PER_STEP,
           ', '.join(c[0] for c in CONFIGS), rounds, seconds, clients))
    # the live leaves are a few hundred; free_empty_leaves = off keeps ~35
    # more a step (28 MB after 200 steps): the minimum pool has room
    pool_mb = 256
    cl = ab.Cluster(args.workdir, 'window', pool_mb, pool_mb,
                    pool_on_shm=(args.config == 'shm'),
                    synchronous_commit='off' if args.config == 'shm' else 'on')
    summary = {'machine': info, 'config': args.config, 'config_note': ab.CONFIG_NOTE[args.config],
               'steps': steps, 'rows_per_step': ROWS_PER_STEP, 'window_steps': WINDOW_STEPS,
               'clients': clients, 'seconds': seconds, 'rounds': rounds,
               'configs': [c[0] for c in CONFIGS]}
    try:
        t0 = time.monotonic()
        cl.start()

        # -- the tables, the window filled, the indexes built on it
        # ids come from one sequence, not a serial per table: the same row
        # has the same id in every table, which the parity check relies on.
        # No autovacuum: VACUUM runs where the driver says.
        cl.sql('CREATE SEQUENCE w_ids; '
               'CREATE TABLE step_src (id bigint, step int, b box) WITH (autovacuum_enabled = off)')
        for _, table, _, _ in CONFIGS:
            cl.sql(f'CREATE TABLE {table} (id bigint PRIMARY KEY, step int, b box) '
                   f'WITH (autovacuum_enabled = off)')
        first = WINDOW_STEPS - 1
        for s in range(first + 1):
            stage_step(cl, s)
            for _, table, _, _ in CONFIGS:
                cl.sql(f'INSERT INTO {table} SELECT id, step, b FROM step_src')
        ab.phase(t0, 'indexes built on the first window (steps 0 .. %d, %d rows)'
                 % (first, (first + 1) * ROWS_PER_STEP))
        series = {c[0]: [] for c in CONFIGS}
        for name, table, method, opts in CONFIGS:
            if method:
                with_ = ' WITH (%s)' % opts if opts else ''
                secs = cl.timed(f'CREATE INDEX {table}_b ON {table} USING {method} (b){with_}')
            cl.sql(f'VACUUM ANALYZE {table}')
            size = sizes(cl, method, table)
            series[name].append({'step': first, 'size': size})
            res.add(step=first, config=name, rows=(first + 1) * ROWS_PER_STEP,
                    index_bytes=size['total'], dram_bytes=size['dram'], pmem_bytes=size['pmem'],
                    ssd_bytes=size['ssd'], leaves=size['leaves'], inner_nodes=size['inner_nodes'],
                    insert_s='', delete_s='', vacuum_s='')
            if method:
                log('  %-30s build %6.3f s  %8.1f kB%s' % (name, secs, size['total'] / 1024,
                    '  (%d leaves, %d inner nodes)' % (size['leaves'], size['inner_nodes'])
                    if method == 'amrtree' else '  (%d pages)' % (size['total'] // 8192)))

        # -- the slide
        ab.phase(t0, '%d steps: INSERT %d rows, DELETE the oldest step, VACUUM (INDEX_CLEANUP on)'
                 % (steps, ROWS_PER_STEP))
        every = max(1, steps // 10)
        log('  %5s %8s   %s   (index kB; VACUUM ms)' % ('step', 'rows', '  '.join(
            '%18s' % SHORT[c[0]] for c in CONFIGS)))
        last = first + steps
        for i, s in enumerate(range(first + 1, last + 1)):
            stage_step(cl, s)
            for name, table, method, _ in ab.rotated(CONFIGS, i):
                ins, dele, vac = timed_each(cl, [
                    f'INSERT INTO {table} SELECT id, step, b FROM step_src',
                    f'DELETE FROM {table} WHERE step <= {s - WINDOW_STEPS}',
                    f'VACUUM (INDEX_CLEANUP on) {table}'])
                size = sizes(cl, method, table)
                series[name].append({'step': s, 'size': size, 'insert_s': ins,
                                     'delete_s': dele, 'vacuum_s': vac})
                res.add(step=s, config=name, rows=WINDOW_STEPS * ROWS_PER_STEP,
                        index_bytes=size['total'], dram_bytes=size['dram'],
                        pmem_bytes=size['pmem'], ssd_bytes=size['ssd'], leaves=size['leaves'],
                        inner_nodes=size['inner_nodes'], insert_s=ins, delete_s=dele, vacuum_s=vac)
            if (s - first) % every == 0 or s == last:
                log('  %5d %8d   %s' % (s, WINDOW_STEPS * ROWS_PER_STEP, '  '.join(
                    '%9s %8.1f' % ('%.0f' % (series[c[0]][-1]['size']['total'] / 1024)
                                   if c[2] else '-', 1000 * series[c[0]][-1]['vacuum_s'])
                    for c in CONFIGS)))

        # -- parity, then queries over the final window
        ab.phase(t0, 'check: every index returns what a sequential scan returns')
        make_check_windows(cl, last - WINDOW_STEPS + 1, last)
        for _, table, _, _ in CONFIGS:
            cl.sql(f'ANALYZE {table}')
        checked = check_parity(cl)
        summary['parity_digests'] = checked
        log('  %d digests of 45 windows (40 over the live steps, 5 over deleted ones), '
            '&&, @> and <@, index and bitmap scans against sequential scans: all equal' % checked)

        ab.phase(t0, 'pgbench range.sql over the final window (steps %d .. %d), %d client(s), '
                 '%d round(s) of %d s' % (last - WINDOW_STEPS + 1, last, clients, rounds, seconds))
        ncenters = ab.make_centers(cl, src='w_gist', n=2000)
        windows = {}
        for h in QUERY_HALF_SIZES:
            mean_rows = float(cl.sql(f"""
SET enable_seqscan = off;
SELECT avg((SELECT count(*) FROM w_gist t
            WHERE t.b && box(point(c.x - {h}, c.y - {h}), point(c.x + {h}, c.y + {h}))))
FROM bench_centers c WHERE c.id <= 100""").splitlines()[-1])
            label = '%g x %g' % (2 * h, 2 * h)
            windows[label] = {'half': h, 'mean_rows': mean_rows}
            plans = {SHORT[n]: ab.plan_of(cl, t, h, h) for n, t, _, _ in INDEXED}
            log('  window %-11s %5.1f rows on average; plans: %s' % (label, mean_rows, ', '.join(
                '%s %s' % kv for kv in plans.items())))
            windows[label]['plans'] = plans
        summary['windows'] = windows
        tps = {}
        for label, w in windows.items():
            runs = {}
            for rnd in range(rounds):
                for name, table, _, _ in ab.rotated(INDEXED, rnd):
                    r = cl.pgbench([os.path.join(ab.SCRIPTS, 'range.sql')], clients,
                                   seconds=seconds,
                                   defines={'n': ncenters, 'hw': w['half'], 'hh': w['half'],
                                            'tbl': table})
                    runs.setdefault(name, []).append(r['tps'])
            tps[label] = {name: dict(zip(('tps', 'sd'), ab.mean_sd(v))) for name, v in runs.items()}
        summary['tps'] = tps

        # -- the numbers
        summary['results'] = report(series, tps, steps, rounds)
        summary['elapsed_s'] = time.monotonic() - t0
        summary['loadavg_end'] = [round(x, 2) for x in os.getloadavg()]
        csvp = res.write_csv()
        with open(os.path.join(outdir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=1, default=str)
        plot(series, summary, outdir)
        log('\nresults: %s (per step and configuration), summary.json in %s' % (csvp, outdir))
        log('elapsed: %.0f s; load average at the end %s' % (summary['elapsed_s'],
                                                            summary['loadavg_end']))
    finally:
        cl.remove()


def report(series, tps, steps, rounds):
    """Print the final sizes, the times per step and the query throughput,
    each against GiST's; return them for summary.json."""
    out = {}
    half = steps // 2
    for name, _, method, _ in CONFIGS:
        pts = series[name]
        slid = pts[1:]                  # the measured steps (pts[0]: after the build)
        tail = slid[half:] if steps >= 4 else slid
        r = out[name] = {}
        final = pts[-1]['size']
        r['final_bytes'] = final['total']
        r['built_bytes'] = pts[0]['size']['total']
        r['final_leaves'] = final['leaves']
        # growth per step over the second half: what is left once the
        # first VACUUMs have settled the index
        r['bytes_per_step'] = slope([p['step'] for p in tail], [p['size']['total'] for p in tail])
        for k in ('vacuum_s', 'insert_s', 'delete_s'):
            r[k], r[k + '_sd'] = ab.mean_sd([p[k] for p in slid])
    base = out['no index']
    for name, r in out.items():
        # what the box index adds to VACUUM and INSERT: beyond the table
        # with its primary key alone
        r['vacuum_index_s'] = r['vacuum_s'] - base['vacuum_s']
        r['insert_index_s'] = r['insert_s'] - base['insert_s']
    g = out['gist']
    for name, r in out.items():
        r['ratios'] = {
            'final_bytes': ab.ratio(r['final_bytes'], g['final_bytes']),
            'vacuum_s': ab.ratio(r['vacuum_s'], g['vacuum_s']),
            'vacuum_index_s': ab.ratio(r['vacuum_index_s'], g['vacuum_index_s']),
            'insert_s': ab.ratio(r['insert_s'], g['insert_s']),
            'insert_index_s': ab.ratio(r['insert_index_s'], g['insert_index_s']),
        }
        for label, per in tps.items():
            if name in per:
                r['ratios']['tps ' + label] = ab.ratio(per[name]['tps'], per['gist']['tps'])

    log('\n== index size (amrtree: DRAM for inner nodes + 4 kB leaves; GiST: the relation, '
        'free pages included)')
    log('  %-30s %10s %10s %8s %9s %14s' % ('config', 'built kB', 'final kB', 'x GiST',
                                             'leaves', 'growth kB/step'))
    for name, _, method, _ in INDEXED:
        r = out[name]
        log('  %-30s %10.1f %10.1f %8.2f %9s %14.1f' % (
            name, r['built_bytes'] / 1024, r['final_bytes'] / 1024, r['ratios']['final_bytes'],
            r['final_leaves'] if method == 'amrtree' else '%d pg' % (r['final_bytes'] // 8192),
            r['bytes_per_step'] / 1024))
    log('  (growth: least-squares slope of the size over the last %d steps)' % (steps - half))

    log('\n== time per step, mean over %d steps (ms; "index" = beyond the table with only its '
        'primary key)' % steps)
    log('  %-30s %9s %7s %8s %9s %8s %7s %8s %9s %8s' % (
        'config', 'VACUUM', 'sd', 'x GiST', 'index', 'x GiST', 'INSERT', 'x GiST', 'index',
        'x GiST'))
    for name, _, method, _ in CONFIGS:
        r = out[name]
        rt = r['ratios']
        log('  %-30s %9.1f %7.1f %8s %9s %8s %7.1f %8s %9s %8s' % (
            name, 1000 * r['vacuum_s'], 1000 * r['vacuum_s_sd'],
            '%.2f' % rt['vacuum_s'] if method else '',
            '%.1f' % (1000 * r['vacuum_index_s']) if method else '',
            '%.2f' % rt['vacuum_index_s'] if method else '',
            1000 * r['insert_s'], '%.2f' % rt['insert_s'] if method else '',
            '%.1f' % (1000 * r['insert_index_s']) if method else '',
            '%.2f' % rt['insert_index_s'] if method else ''))

    log('\n== range queries over the final window (tps, mean of %d rounds; ratio to GiST)' % rounds)
    log('  %-12s %s' % ('window', '  '.join('%22s' % SHORT[c[0]] for c in INDEXED)))
    for label, per in tps.items():
        log('  %-12s %s' % (label, '  '.join(
            '%9.0f (sd %4.0f) %5.2f' % (per[c[0]]['tps'], per[c[0]]['sd'],
                                        ab.ratio(per[c[0]]['tps'], per['gist']['tps']))
            for c in INDEXED)))
    return out


def plot(series, summary, outdir):
    plt = ab.plt_or_none()
    if not plt:
        return
    title = '%d rows per step, window of %d steps, %s configuration' % (
        summary['rows_per_step'], summary['window_steps'], summary['config'])
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, _, method, _ in INDEXED:
        pts = series[name]
        ax.plot([p['step'] for p in pts], [p['size']['total'] / 1048576 for p in pts],
                label=name)
    ax.set_xlabel('step')
    ax.set_ylabel('index size (MiB)')
    ax.set_ylim(bottom=0)
    ax.set_title('Index size as the window slides\n' + title)
    ab.save_figure(plt, fig, ax, outdir, 'window-size.png')

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, _, _, _ in CONFIGS:
        pts = series[name][1:]
        ax.plot([p['step'] for p in pts], [1000 * p['vacuum_s'] for p in pts], label=name,
                linewidth=0.8)
    ax.set_xlabel('step')
    ax.set_ylabel('VACUUM (INDEX_CLEANUP on), ms')
    ax.set_ylim(bottom=0)
    ax.set_title('VACUUM time per step\n' + title)
    ab.save_figure(plt, fig, ax, outdir, 'window-vacuum.png')


def main():
    p, sub = ab.driver_parser(__doc__)
    c = sub.add_parser('window')
    c.add_argument('--quick', action='store_true', help='60 steps, 1 s per pgbench run')
    c.add_argument('--steps', type=int, help='measured steps (default 200, --quick 60)')
    c.add_argument('--config', choices=['disk', 'shm'], default='disk',
                   help="disk: amrtree's default pool file in the data directory, "
                   'synchronous_commit on; shm: the pool on /dev/shm, synchronous_commit off')
    c.add_argument('--clients', type=int, default=2)
    c.add_argument('--seconds', type=int, help='seconds per pgbench run (default 3, --quick 1)')
    c.add_argument('--rounds', type=int, help='pgbench rounds through the methods (default 3)')
    args = p.parse_args()
    ab.run_command(cmd_window, args)


if __name__ == '__main__':
    main()
