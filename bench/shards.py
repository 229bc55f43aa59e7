#!/usr/bin/env python3
"""amrtree scale-out benchmark: query throughput through a postgres_fdw
coordinator against a single server, on the same data.

    shards.py --workdir W --results R shards [--quick] [options]

Run through the wrapper bench/shards, which installs the dependencies,
builds and installs amrtree, and runs this file as the unprivileged
PostgreSQL user.  The clusters, the data and the measurements come from
bench/amrbench.py's helpers.

Three throwaway servers on this machine:
  shard1  amrtree; trips_all (every row: the single-server case, and the
          one shard of the 1-shard coordinator) and trips_west
  shard2  amrtree; trips_east
  coord   postgres_fdw only; trips1 (one foreign partition, shard1's
          trips_all) and trips2 (two foreign partitions by range of the
          box's west edge, (b[1])[0], split at its median)
Rows reach the shards through the coordinator (INSERT into the partitioned
tables); the amrtree indexes are built on the shards.  pgbench runs random
windows (bench/scripts/shard_range.sql) against the single server, the
1-shard and the 2-shard coordinator, and the 2-shard coordinator with the
pruning predicate (shard_range_pruned.sql), interleaved, for each window
size.  Before measuring, every configuration is checked to return the
single server's rows.

All servers and pgbench share this machine's cores: with two cores, a
coordinator and its shards compete for the same CPUs as the single server
alone, so shards cannot add throughput here; what this measures is the
coordinator's overhead and whether splitting a query costs or saves work.
"""

import datetime
import json
import os
import sys
import time

sys.dont_write_bytecode = True          # run as another user: no __pycache__ in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import amrbench as ab                   # noqa: E402
from amrbench import log                # noqa: E402

CONFIGS = [
    # name, server, table, script
    ('single', 'shard1', 'trips_all', 'shard_range.sql'),
    ('coord 1 shard', 'coord', 'trips1', 'shard_range.sql'),
    ('coord 2 shards', 'coord', 'trips2', 'shard_range.sql'),
    ('coord 2 shards, pruned', 'coord', 'trips2', 'shard_range_pruned.sql'),
]


def fdw_setup(coord, shards):
    """postgres_fdw servers for the shards.  async_capable: an Append sends
    its query to every shard before waiting for any (PostgreSQL 14+);
    fetch_size 1000: a window's rows in one or a few round trips;
    batch_size 1000: INSERT through the coordinator in batches."""
    coord.sql('CREATE EXTENSION postgres_fdw')
    for name, cl in shards.items():
        coord.sql(f"""
CREATE SERVER {name} FOREIGN DATA WRAPPER postgres_fdw
  OPTIONS (host '{cl.dir}', port '{cl.port}', dbname 'bench', fetch_size '1000',
           batch_size '1000', async_capable 'true');
CREATE USER MAPPING FOR CURRENT_USER SERVER {name};""")


def ids_digest(cl, table, hw, hh, ncheck, pruned=False):
    """A digest of the sorted ids each of the first ncheck windows returns."""
    extra = ' AND (t.b[1])[0] <= c.x + %r + 1e-5' % hw if pruned else ''
    return cl.sql(f"""
SELECT md5(string_agg(c.id || ':' || (SELECT coalesce(array_agg(t.id ORDER BY t.id), '{{}}') FROM {table} t
       WHERE t.b && box(point(c.x - {hw}, c.y - {hh}), point(c.x + {hw}, c.y + {hh})){extra})::text, ','
       ORDER BY c.id))
FROM bench_centers c WHERE c.id <= {ncheck}""")


def cmd_shards(args):
    quick = args.quick
    rows = args.rows or (100000 if quick else 1000000)
    # --quick: several short runs rather than one long one, so that a burst
    # of other work on the machine shows as a standard deviation
    seconds = args.seconds or (2 if quick else 10)
    reps = args.reps or 3
    clients = args.clients
    sels = [0.00001, 0.001, 0.01] if quick else ab.SELECTIVITIES
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    outdir = os.path.join(args.results, 'shards-' + stamp)
    res = ab.Results(outdir, 'shards')
    info = ab.machine_info()
    ab.print_machine(info)
    log('shards: %d Porto-like rows, %d client(s), %d s per pgbench run, %d repetition(s), '
        'window areas %s' % (rows, clients, seconds, reps, ', '.join(ab.pct(s) for s in sels)))
    if (os.cpu_count() or 1) <= 4:
        log('note: %s cores for pgbench, the coordinator and both shards together: shards '
            'cannot add CPU here, only overhead or savings per query' % os.cpu_count())
    # shard1 holds every row twice over (trips_all and trips_west)
    pool_mb = max(256, int(rows * ab.ENTRY_BYTES * 4 / 1048576) * 3 + 256)
    shard1 = ab.Cluster(args.workdir, 'shard1', pool_mb, pool_mb)
    shard2 = ab.Cluster(args.workdir, 'shard2', pool_mb, pool_mb)
    # The coordinator needs no amrtree: the last shared_preload_libraries
    # line wins.  (Cluster.start still runs CREATE EXTENSION amrtree, which
    # works without the library loaded and is never used here.)
    coord = ab.Cluster(args.workdir, 'coord', 64, 64,
                       extra_conf="shared_preload_libraries = ''\n")
    servers = {'shard1': shard1, 'shard2': shard2, 'coord': coord}
    logdir = os.path.join(coord.dir, 'pgbench-logs')
    summary = {'machine': info, 'rows': rows, 'clients': clients, 'seconds': seconds,
               'reps': reps, 'configs': [c[0] for c in CONFIGS]}
    try:
        t0 = time.monotonic()
        for cl in servers.values():
            cl.start()
        os.makedirs(logdir, exist_ok=True)
        csvpath = ab.generate_data(args.workdir, rows)
        fdw_setup(coord, {'shard1': shard1, 'shard2': shard2})

        # -- data: staged on the coordinator, inserted through it
        ab.load_source(coord, csvpath)
        ncenters = ab.make_centers(coord)
        centers = os.path.join(args.workdir, 'bench_centers.copy')
        coord.sql(f"COPY bench_centers TO '{centers}'")
        shard1.sql(f"""CREATE TABLE bench_centers (id int PRIMARY KEY, x float8, y float8);
COPY bench_centers FROM '{centers}'; ANALYZE bench_centers;""")
        shard1.sql('CREATE TABLE trips_all (id int, b box, t float8); '
                   'CREATE TABLE trips_west (id int, b box, t float8)')
        shard2.sql('CREATE TABLE trips_east (id int, b box, t float8)')
        split = coord.sql('SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY (b[1])[0]) FROM src')
        coord.sql(f"""
CREATE TABLE trips1 (id int, b box, t float8) PARTITION BY RANGE (((b[1])[0]));
CREATE FOREIGN TABLE trips1_all PARTITION OF trips1 FOR VALUES FROM (MINVALUE) TO (MAXVALUE)
  SERVER shard1 OPTIONS (table_name 'trips_all');
CREATE TABLE trips2 (id int, b box, t float8) PARTITION BY RANGE (((b[1])[0]));
CREATE FOREIGN TABLE trips2_west PARTITION OF trips2 FOR VALUES FROM (MINVALUE) TO ({split})
  SERVER shard1 OPTIONS (table_name 'trips_west');
CREATE FOREIGN TABLE trips2_east PARTITION OF trips2 FOR VALUES FROM ({split}) TO (MAXVALUE)
  SERVER shard2 OPTIONS (table_name 'trips_east');""")
        log('\n== INSERT ... SELECT of %d rows through the coordinator (batch_size 1000)' % rows)
        summary['insert'] = {}
        for table, label in (('trips1', '1 shard'), ('trips2', '2 shards')):
            secs = coord.timed(f'INSERT INTO {table} SELECT * FROM src')
            summary['insert'][label] = rows / secs
            res.add(metric='insert_rows_per_s', config='coord ' + label, value=rows / secs, unit='rows/s')
            log('  %-9s %7.2f s  %9.0f rows/s' % (label, secs, rows / secs))
        nwest = int(shard1.sql('SELECT count(*) FROM trips_west'))
        neast = int(shard2.sql('SELECT count(*) FROM trips_east'))
        log('  split at x = %s: %d rows on shard1 (trips_west), %d on shard2 (trips_east)'
            % (split, nwest, neast))
        if nwest + neast != rows or int(shard1.sql('SELECT count(*) FROM trips_all')) != rows:
            raise RuntimeError('rows went missing on the way to the shards')

        # -- indexes on the shards, settled as bench/compare does
        log('\n== amrtree indexes, built on the shards')
        for server, table in (('shard1', 'trips_all'), ('shard1', 'trips_west'), ('shard2', 'trips_east')):
            cl = servers[server]
            secs = cl.timed(f'CREATE INDEX {table}_b ON {table} USING amrtree (b)')
            cl.sql(f"VACUUM ANALYZE {table}; SELECT amrtree_settle('{table}_b', 1)")
            log('  %-10s on %s: build %.2f s' % (table, server, secs))
        coord.sql('ANALYZE trips1; ANALYZE trips2')

        log('\n== query windows (centred on data boxes; selectivity = window area / data space area)')
        spread = ab.data_spread(shard1)
        windows = ab.make_windows(shard1, 'trips_all', rows, spread, sels)
        summary['windows'] = {ab.pct(s): {'hw': w[0], 'hh': w[1], 'mean_rows': w[2]}
                              for s, w in windows.items()}

        # -- every configuration returns the single server's rows
        ncheck = 50
        hw, hh = windows[sels[-1]][0], windows[sels[-1]][1]
        want = ids_digest(shard1, 'trips_all', hw, hh, ncheck)
        for name, server, table, script in CONFIGS[1:]:
            got = ids_digest(coord, table, hw, hh, ncheck, pruned='pruned' in script)
            if got != want:
                raise RuntimeError('%s returns other rows than the single server' % name)
        log('\n== check: on %d windows (area %s) every configuration returns the single server\'s rows'
            % (ncheck, ab.pct(sels[-1])))

        # -- what runs where
        w = "box(point(-8.615, 41.145), point(-8.61, 41.15))"
        plan = coord.sql(f'EXPLAIN (VERBOSE, COSTS OFF) SELECT id, b FROM trips2 WHERE b && {w}')
        remote = [l.strip() for l in plan.splitlines() if 'Remote SQL' in l or 'Foreign Scan' in l]
        shard_plan = shard1.sql(f'EXPLAIN (COSTS OFF) SELECT id, b FROM trips_west WHERE b && {w}')
        log('\n== plans: the coordinator ships the operator, the shard answers it with amrtree')
        for l in remote:
            log('  coord:  ' + l)
        log('  shard1: ' + ' / '.join(l.strip() for l in shard_plan.splitlines()))
        summary['plans'] = {'coordinator': remote, 'shard1': shard_plan.splitlines()}

        # -- throughput
        log('\n== pgbench, %d clients, %d x %d s per configuration and window (tps mean and sd; '
            'latency avg / p95 in ms)' % (clients, reps, seconds))
        log('  %-8s %-24s %9s %7s %8s %8s' % ('area', 'config', 'tps', 'sd', 'avg', 'p95'))
        summary['tps'] = {}
        summary['loadavg_before'] = loadavg()
        for s in sels:
            hw, hh = windows[s][0], windows[s][1]
            defs = {'n': ncenters, 'hw': hw, 'hh': hh}
            runs = {}
            for rep in range(reps):
                # rotate the order so that no configuration always runs first
                k = rep % len(CONFIGS)
                for name, server, table, script in CONFIGS[k:] + CONFIGS[:k]:
                    cl = servers[server]
                    sc = [os.path.join(ab.SCRIPTS, script)]
                    if rep == 0:    # warm-up: connections to the shards, caches
                        cl.pgbench(sc, clients, seconds=1, defines=dict(defs, tbl=table))
                    r = cl.pgbench(sc, clients, seconds=seconds, defines=dict(defs, tbl=table),
                                   tag='q', logdir=logdir)
                    runs.setdefault(name, []).append(r)
            per = {}
            for name, _, _, _ in CONFIGS:
                t, sd = ab.mean_sd([r['tps'] for r in runs[name]])
                lat = ab.lat_summary([x for r in runs[name] for x in r['lat']])
                per[name] = {'tps': t, 'sd': sd, **lat}
                res.add(metric='tps', area=ab.pct(s), config=name, value=t, sd=sd, unit='tps',
                        lat_avg_ms=lat['avg'], lat_p95_ms=lat['p95'], lat_p99_ms=lat['p99'],
                        mean_rows=windows[s][2])
                log('  %-8s %-24s %9.0f %7.0f %8.3f %8.3f' % (ab.pct(s), name, t, sd, lat['avg'], lat['p95']))
            summary['tps'][ab.pct(s)] = per

        # other work on the machine competes for the same cores
        summary['loadavg_after'] = loadavg()
        log('  load average (1 min) just before the runs: %.2f (this benchmark was idle then: '
            'that much other work was running); just after: %.2f'
            % (summary['loadavg_before'], summary['loadavg_after']))

        # -- ratios
        log('\n== ratios of tps')
        cols = [('1 shard / single', 'coord 1 shard', 'single'),
                ('2 shards / single', 'coord 2 shards', 'single'),
                ('2 shards / 1 shard', 'coord 2 shards', 'coord 1 shard'),
                ('2 pruned / single', 'coord 2 shards, pruned', 'single'),
                ('2 pruned / 2 shards', 'coord 2 shards, pruned', 'coord 2 shards')]
        log('  %-8s %s' % ('area', ' '.join('%20s' % c[0] for c in cols)))
        summary['ratios'] = {}
        for area, per in summary['tps'].items():
            vals = [per[a]['tps'] / per[b]['tps'] for _, a, b in cols]
            summary['ratios'][area] = {c[0]: v for c, v in zip(cols, vals)}
            for c, v in zip(cols, vals):
                res.add(metric='tps_ratio', area=area, config=c[0], value=v, unit='x')
            log('  %-8s %s' % (area, ' '.join('%20.2f' % v for v in vals)))
        summary['elapsed_s'] = time.monotonic() - t0

        csvp = res.write_csv()
        with open(os.path.join(outdir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=1, default=str)
        plot(summary, outdir)
        log('\nresults: %s (CSV), summary.json, shards-tps.png in %s' % (csvp, outdir))
        log('elapsed: %.0f s' % summary['elapsed_s'])
    finally:
        for cl in servers.values():
            cl.remove()


def loadavg():
    try:
        with open('/proc/loadavg') as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float('nan')


def plot(summary, outdir):
    plt = ab.plt_or_none()
    if not plt:
        return
    areas = list(summary['tps'].keys())
    names = summary['configs']
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([x + (i - (len(names) - 1) / 2) * width for x in range(len(areas))],
               [summary['tps'][a][name]['tps'] for a in areas], width,
               yerr=[summary['tps'][a][name]['sd'] for a in areas], label=name)
    ax.set_xticks(range(len(areas)))
    ax.set_xticklabels(['window area %s' % a for a in areas])
    ax.set_ylabel('transactions / s')
    ax.set_title('Range queries returning rows, %d rows, %d client(s), %d cores'
                 % (summary['rows'], summary['clients'], summary['machine']['cores']))
    ab.save_figure(plt, fig, ax, outdir, 'shards-tps.png')


def main():
    p, sub = ab.driver_parser(__doc__)
    c = sub.add_parser('shards')
    c.add_argument('--quick', action='store_true',
                   help='100,000 rows, three window sizes, 2 s per run')
    c.add_argument('--rows', type=int)
    c.add_argument('--clients', type=int, default=2)
    c.add_argument('--seconds', type=int)
    c.add_argument('--reps', type=int)
    args = p.parse_args()
    ab.run_command(cmd_shards, args)


if __name__ == '__main__':
    main()
