#!/usr/bin/env python3
"""amrtree benchmark drivers.

    amrbench.py compare       amrtree vs GiST vs SP-GiST on the same data
    amrbench.py budget_sweep  the AMR-Tree paper's budget sweep (section 4.2)

Run through the wrappers bench/compare and bench/budget_sweep, which install
the dependencies, build and install amrtree, and run this file as the
unprivileged PostgreSQL user.  Every run starts its own throwaway cluster
(amrtree preloaded, PMEM pool emulated on /dev/shm, SSD slot file on disk;
compare --config disk|both: also or instead the pool as a disk file in the
data directory, amrtree's default) and removes it at the end, also on
Ctrl-C.

Timings on a shared 2-core machine are noisy: every figure that matters is
reported as a ratio between methods measured in the same run, interleaved,
and repeated where the time allows.
"""

import argparse
import csv
import datetime
import glob
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_BIN = os.environ.get('AMR_PG_BIN', '/usr/lib/postgresql/15/bin')
SCRIPTS = os.path.join(ROOT, 'bench', 'scripts')
ENTRY_BYTES = 48            # sizeof(AmrLeafEntry), src/core/amr_format.h
AMS = ['amrtree', 'amrtree_notier', 'gist', 'spgist']
AM_LABEL = {'amrtree': 'amrtree', 'amrtree_notier': 'amrtree (tiering off)',
            'gist': 'GiST', 'spgist': 'SP-GiST'}
SELECTIVITIES = [0.00001, 0.0001, 0.001, 0.01]     # 0.001 % ... 1 %
QUICK_SELECTIVITIES = [0.00001, 0.001, 0.01]
# compare --config: where the pool is and how commits are made durable
CONFIG_NOTE = {
    'shm': 'PMEM emulated: the pool is a file on /dev/shm (DRAM-backed tmpfs); '
           'synchronous_commit = off',
    'disk': "amrtree's default: the pool is pg_amrtree/pmem.pool in the data directory "
            '(a disk file, written back in the background, commits durable through the WAL); '
            'synchronous_commit = on',
}


def log(msg):
    print(msg, flush=True)


def pct(s):
    return '%g%%' % (s * 100)


class Interrupted(Exception):
    pass


def on_signal(signum, frame):
    raise Interrupted('signal %d' % signum)


# ---------------------------------------------------------------- cluster

def free_port(start):
    port = start
    while True:
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
                return port
            except OSError:
                port += 1


class Cluster:
    """A throwaway PostgreSQL cluster with amrtree preloaded.

    pool_on_shm: the PMEM pool is a file on /dev/shm (emulated PMEM, the
    benchmarks' default); otherwise amrtree.pmem_path is left unset, so the
    pool is amrtree's default, pg_amrtree/pmem.pool in the data directory (a
    disk file, written back in the background).  Clusters running side by side get
    different ports (port_offset)."""

    def __init__(self, workdir, name, pmem_mb, ssd_mb, extra_conf='', pool_on_shm=True,
                 synchronous_commit='off', port_offset=0):
        self.dir = os.path.join(workdir, name)
        self.data = os.path.join(self.dir, 'data')
        self.port = free_port(56000 + (os.getpid() + 10 * port_offset) % 1000)
        self.pool_on_shm = pool_on_shm
        if pool_on_shm:
            self.pool = '/dev/shm/amrbench-%s-%s.pool' % (os.environ.get('AMRBENCH_TAG', os.getpid()), name)
        else:
            self.pool = os.path.join(self.data, 'pg_amrtree', 'pmem.pool')
        self.synchronous_commit = synchronous_commit
        self.pmem_mb = pmem_mb
        self.ssd_mb = ssd_mb
        self.extra_conf = extra_conf
        self.running = False

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        subprocess.run([PG_BIN + '/initdb', '-D', self.data, '-A', 'trust',
                        '-U', 'postgres', '--no-sync'],
                       check=True, stdout=subprocess.DEVNULL)
        # without amrtree.pmem_path the pool is amrtree's default file
        pool_conf = "amrtree.pmem_path = '%s'" % self.pool if self.pool_on_shm else ''
        with open(os.path.join(self.data, 'postgresql.conf'), 'a') as f:
            f.write(f"""
# amrtree benchmark cluster (bench/amrbench.py)
shared_preload_libraries = 'amrtree'
port = {self.port}
listen_addresses = ''
unix_socket_directories = '{self.dir}'
{pool_conf}
amrtree.pmem_size = {self.pmem_mb}MB
amrtree.ssd_size = {self.ssd_mb}MB
amrtree.dram_size = 128MB
shared_buffers = 1GB
work_mem = 64MB
maintenance_work_mem = 1GB
max_wal_size = 8GB
checkpoint_timeout = 30min
synchronous_commit = {self.synchronous_commit}
max_parallel_workers_per_gather = 0
jit = off
{self.extra_conf}
""")
        subprocess.run([PG_BIN + '/pg_ctl', '-D', self.data, '-l',
                        os.path.join(self.dir, 'server.log'), '-w', 'start'],
                       check=True, stdout=subprocess.DEVNULL)
        self.running = True
        self.sql('CREATE DATABASE bench', db='postgres')
        self.sql('CREATE EXTENSION amrtree')

    def stop(self):
        if not self.running:
            return
        r = subprocess.run([PG_BIN + '/pg_ctl', '-D', self.data, '-m', 'fast',
                            '-w', '-t', '60', 'stop'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if r.returncode != 0:
            subprocess.run([PG_BIN + '/pg_ctl', '-D', self.data, '-m',
                            'immediate', 'stop'],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.running = False

    def remove(self):
        self.stop()
        if self.pool_on_shm:
            for p in (self.pool, self.pool + '.grow'):
                if os.path.exists(p):
                    os.unlink(p)
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart_to_first_query(self, query, timeout=120):
        """Stop the server (fast shutdown), start it, and time until `query`
        first returns: the stop, the start-up, the work that the first use
        of an index does (amrtree reconciles its pool and rebuilds the inner
        nodes of every tree in it from the Leaf Table), and the query.
        pg_ctl -w polls only ten times a second, so neither the stop nor the
        start is waited for with it: the stop by watching postmaster.pid,
        the start by psql trying every few milliseconds until it gets in.
        Returns seconds (stop, start to the first result, the first query
        alone)."""
        # the shutdown checkpoint then has nothing to write: what it would
        # write depends on what ran before, not on the index method
        self.sql('CHECKPOINT')
        pidfile = os.path.join(self.data, 'postmaster.pid')
        t0 = time.monotonic()
        subprocess.run([PG_BIN + '/pg_ctl', '-D', self.data, '-m', 'fast', '-W', 'stop'],
                       check=True, stdout=subprocess.DEVNULL)
        while os.path.exists(pidfile):
            if time.monotonic() - t0 > timeout:
                raise RuntimeError('the server did not stop in %d s' % timeout)
            time.sleep(0.002)
        stop = time.monotonic() - t0
        t0 = time.monotonic()
        subprocess.run([PG_BIN + '/pg_ctl', '-D', self.data, '-l',
                        os.path.join(self.dir, 'server.log'), 'start'],
                       check=True, stdout=subprocess.DEVNULL)
        self.running = True
        while True:
            r = subprocess.run([PG_BIN + '/psql', '-X', '-A', '-t', '-q',
                                '-v', 'ON_ERROR_STOP=1'] + self.conn_args(),
                               input='\\timing on\n' + query, capture_output=True, text=True)
            if r.returncode == 0:
                break
            if time.monotonic() - t0 > timeout:
                raise RuntimeError('no answer %d s after start: %s' % (timeout, r.stderr.strip()))
            time.sleep(0.005)
        start = time.monotonic() - t0
        ms = [float(m) for m in re.findall(r'Time: ([0-9.]+) ms', r.stdout)]
        return stop, start, (ms[-1] / 1000.0 if ms else float('nan'))

    def wal_pos(self):
        """The WAL insert position, in bytes.  Not pg_current_wal_lsn(): that
        is the write position, which with synchronous_commit = off lags the
        insert position until the WAL writer catches up (up to 200 ms), so
        its differences would miss the tail of what a statement wrote."""
        return int(self.sql("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"))

    def conn_args(self, db='bench'):
        return ['-h', self.dir, '-p', str(self.port), '-d', db]

    def sql(self, query, db='bench'):
        r = subprocess.run([PG_BIN + '/psql', '-X', '-A', '-t', '-q',
                            '-v', 'ON_ERROR_STOP=1'] + self.conn_args(db),
                           input=query, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError('psql failed: %s\n%s' % (r.stderr.strip(), query))
        return r.stdout.strip()

    def rows(self, query):
        out = self.sql(query)
        return [line.split('|') for line in out.splitlines() if line]

    def timed(self, query):
        """Server round trip time of one statement, in seconds (psql \\timing)."""
        out = self.sql('\\timing on\n' + query)
        ms = [float(m) for m in re.findall(r'Time: ([0-9.]+) ms', out)]
        return sum(ms) / 1000.0

    def pgbench(self, scripts, clients, seconds=None, transactions=None,
                defines=None, tag='run', logdir=None, gucs=None, protocol=None):
        """Run pgbench; returns tps, transactions and per-transaction
        latencies (ms).  gucs: settings for its sessions (PGOPTIONS);
        protocol: pgbench's -M (default simple)."""
        cmd = [PG_BIN + '/pgbench', '-n', '-c', str(clients), '-j', str(clients)]
        if protocol:
            cmd += ['-M', protocol]
        if seconds is not None:
            cmd += ['-T', str(seconds)]
        else:
            cmd += ['-t', str(transactions)]
        for k, v in (defines or {}).items():
            cmd += ['-D', '%s=%s' % (k, v)]
        for s in scripts:
            cmd += ['-f', s]
        prefix = None
        if logdir:
            prefix = os.path.join(logdir, tag)
            for f in glob.glob(prefix + '.*'):
                os.unlink(f)
            cmd += ['--log', '--log-prefix=' + prefix]
        # the database name is pgbench's positional argument: its -d is
        # --debug, which logs every statement and, on two cores, takes CPU
        # from the server and compresses every ratio toward 1
        cmd += ['-h', self.dir, '-p', str(self.port), 'bench']
        env = None
        if gucs:
            env = dict(os.environ, PGOPTIONS=' '.join('-c %s=%s' % kv for kv in gucs.items()))
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.monotonic() - t0
        if r.returncode != 0 or 'aborted' in r.stderr:
            raise RuntimeError('pgbench failed: %s\n%s' % (r.stderr.strip()[-2000:], ' '.join(cmd)))
        m = re.search(r'tps = ([0-9.]+) \(without initial connection time\)', r.stdout)
        tps = float(m.group(1)) if m else float('nan')
        m = re.search(r'number of transactions actually processed: (\d+)', r.stdout)
        tx = int(m.group(1)) if m else 0
        lat = []
        if prefix:
            for f in glob.glob(prefix + '.*'):
                with open(f) as fh:
                    for line in fh:
                        parts = line.split()
                        if len(parts) >= 3:
                            lat.append(int(parts[2]) / 1000.0)
                os.unlink(f)
        return {'tps': tps, 'tx': tx, 'lat': lat, 'wall': wall}


def quantile(values, q):
    if not values:
        return float('nan')
    v = sorted(values)
    k = (len(v) - 1) * q
    lo = math.floor(k)
    hi = math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def lat_summary(lat):
    return {'avg': statistics.fmean(lat) if lat else float('nan'),
            'p50': quantile(lat, 0.50), 'p95': quantile(lat, 0.95),
            'p99': quantile(lat, 0.99)}


def mean_sd(values):
    values = [v for v in values if v == v]
    if not values:
        return float('nan'), float('nan')
    if len(values) == 1:
        return values[0], 0.0
    return statistics.fmean(values), statistics.stdev(values)


def machine_info():
    cpu = '?'
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    cpu = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    mem = '?'
    try:
        with open('/proc/meminfo') as f:
            mem = '%.1f GiB' % (int(f.readline().split()[1]) / 1048576)
    except OSError:
        pass
    commit = os.environ.get('AMR_COMMIT') or subprocess.run(
        ['git', '-C', ROOT, 'rev-parse', '--short', 'HEAD'],
        capture_output=True, text=True).stdout.strip() or '?'
    pgver = subprocess.run([PG_BIN + '/postgres', '--version'],
                           capture_output=True, text=True).stdout.strip()
    # the machine may be shared (other worktrees' test suites): the load
    # before and after a run says whether its numbers had the CPUs alone
    return {'cpu': cpu, 'cores': os.cpu_count(), 'memory': mem,
            'kernel': platform.release(), 'postgres': pgver,
            'amrtree_commit': commit,
            'date': datetime.datetime.now().strftime('%Y-%m-%d %H:%M'),
            'loadavg_start': [round(x, 2) for x in os.getloadavg()],
            'cpu_busy_start': round(cpu_busy(), 3)}


def cpu_busy(seconds=1.0):
    """The fraction of all CPUs' time spent busy over the next `seconds`
    (from /proc/stat; nan where there is none)."""
    def sample():
        with open('/proc/stat') as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]          # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
    except OSError:
        return float('nan')
    return 1 - (i1 - i0) / max(1, t1 - t0)


def print_machine(info, configs=('shm',)):
    log('machine: %(cpu)s, %(cores)s cores, %(memory)s, Linux %(kernel)s' % info)
    log('         %(postgres)s, amrtree %(amrtree_commit)s, %(date)s' % info)
    log('         at the start: CPUs %.0f %% busy over a second, load average %s%s' % (
        100 * info['cpu_busy_start'], info['loadavg_start'],
        '  -- something else is running: expect noisier ratios'
        if info['cpu_busy_start'] > 0.2 else ''))
    for c in configs:
        log('         %-5s %s' % (c + ':', CONFIG_NOTE[c]))
    log('         the SSD tier is a real file with O_DIRECT I/O')


# ---------------------------------------------------------------- data

def generate_data(workdir, rows, seed=42, mode='porto'):
    gen = os.path.join(workdir, 'porto_gen')
    if not os.path.exists(gen):
        subprocess.run(['cc', '-O2', '-o', gen, os.path.join(ROOT, 'bench', 'porto_gen.c'),
                        '-lm'], check=True)
    path = os.path.join(workdir, 'data-%s-%d-%d.csv' % (mode, rows, seed))
    if not os.path.exists(path):
        with open(path, 'w') as f:
            subprocess.run([gen, '--rows', str(rows), '--seed', str(seed),
                            '--mode', mode, '--format', 'csv'], check=True, stdout=f)
    return path


def load_source(cl, csvpath, table='src'):
    cl.sql(f"""
DROP TABLE IF EXISTS {table};
CREATE TABLE {table} (id int PRIMARY KEY, b box, t float8);
COPY {table} (id, b, t) FROM '{csvpath}' WITH (FORMAT csv);
VACUUM ANALYZE {table};""")


def make_centers(cl, src='src', n=10000):
    """Query windows are centred on data boxes, so results are not empty."""
    cl.sql(f"""
DROP TABLE IF EXISTS bench_centers;
SELECT setseed(0.42);
CREATE TABLE bench_centers AS
  SELECT row_number() OVER ()::int AS id, x, y FROM (
    SELECT (center(b))[0] AS x, (center(b))[1] AS y FROM {src} ORDER BY random() LIMIT {n}) s;
ALTER TABLE bench_centers ADD PRIMARY KEY (id);
ANALYZE bench_centers;""")
    return int(cl.sql('SELECT count(*) FROM bench_centers'))


def data_spread(cl):
    """The 1st..99th percentile range of the box centres: the data space that
    window areas are a fraction of (robust to the few trip-joining boxes
    that span the whole city)."""
    dx, dy = cl.rows("""
SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY x) - percentile_cont(0.01) WITHIN GROUP (ORDER BY x),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY y) - percentile_cont(0.01) WITHIN GROUP (ORDER BY y)
FROM bench_centers""")[0]
    return max(float(dx), 1e-9), max(float(dy), 1e-9)


def make_windows(cl, table, nrows, spread, selectivities, sample=100):
    """Window half-sizes per selectivity, where selectivity is the window's
    area as a fraction of the data space (the usual definition for spatial
    range queries), with the data space's aspect ratio.  Result counts are
    measured and reported: on taxi data they exceed the area fraction,
    because long trip-joining boxes overlap any window -- even a point
    centred on a data box meets about 0.3 % of the rows."""
    dx, dy = spread
    out = {}
    for s in selectivities:
        hw, hh = math.sqrt(s) * dx / 2, math.sqrt(s) * dy / 2
        got = float(cl.sql(f"""
SET enable_seqscan = off;
SELECT avg((SELECT count(*) FROM {table} t
            WHERE t.b && box(point(c.x - {hw}, c.y - {hh}), point(c.x + {hw}, c.y + {hh}))))
FROM bench_centers c WHERE c.id <= {sample}""").splitlines()[-1])
        out[s] = (hw, hh, got)
        log('  area %-7s window %.4g x %.4g: %.0f rows on average (%.3f %% of the rows)'
            % (pct(s), 2 * hw, 2 * hh, got, 100 * got / nrows))
    return out


# ---------------------------------------------------------------- results

class Results:
    def __init__(self, outdir, name):
        self.outdir = outdir
        self.name = name
        self.rows = []
        os.makedirs(outdir, exist_ok=True)

    def add(self, **kw):
        self.rows.append(kw)

    def write_csv(self):
        keys = []
        for r in self.rows:
            for k in r:
                if k not in keys:
                    keys.append(k)
        path = os.path.join(self.outdir, self.name + '.csv')
        with open(path, 'w', newline='') as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in self.rows:
                w.writerow(r)
        return path


def save_figure(plt, fig, ax, outdir, name):
    if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(outdir, name), dpi=110)
    plt.close(fig)


def plt_or_none():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        log('note: matplotlib is not installed; no plots')
        return None


# ---------------------------------------------------------------- compare

INDEX_DDL = {
    'amrtree': 'CREATE INDEX {t}_b ON {t} USING amrtree (b)',
    'amrtree_notier': 'CREATE INDEX {t}_b ON {t} USING amrtree (b) WITH (tiering = off)',
    'gist': 'CREATE INDEX {t}_b ON {t} USING gist (b)',
    'spgist': 'CREATE INDEX {t}_b ON {t} USING spgist (b)',
}


def index_bytes(cl, am, table):
    if am.startswith('amrtree'):
        r = cl.rows(f"SELECT dram_bytes, pmem_bytes, ssd_bytes FROM amrtree_index_stats('{table}_b')")[0]
        d, p, s = (int(x) for x in r)
        return {'total': d + p + s, 'dram': d, 'pmem': p, 'ssd': s}
    b = int(cl.sql(f"SELECT pg_relation_size('{table}_b')"))
    return {'total': b, 'dram': 0, 'pmem': 0, 'ssd': 0}


def plan_of(cl, table, hw, hh):
    out = cl.sql(f"""
EXPLAIN (COSTS OFF) SELECT count(*) FROM {table}
WHERE b && (SELECT box(point(x - {hw}, y - {hh}), point(x + {hw}, y + {hh})) FROM bench_centers WHERE id = 1)""")
    for line in out.splitlines():
        m = re.search(r'(Index Only Scan|Bitmap Index Scan|Index Scan|Seq Scan) (using|on) (\S+)', line)
        if m and 'bench_centers' not in line:
            return m.group(1)
    return '?'


SHORT = {'amrtree': 'amrtree', 'amrtree_notier': 'amrtree-off', 'gist': 'GiST',
         'spgist': 'SP-GiST'}
# the targets that later work is judged on, shown beside the ratios
TPS_TARGETS = {'range 0.001%': '>= 1.2', 'range 0.1%': '>= 1.5', 'knn k=10': '>= 2',
               'knn points k=10': '>= 2', 'postgis && 0.1%': '>= 1.5',
               'postgis && 0.001%': '>= 1.5', 'postgis && 1%': '>= 1.5',
               'insert sync 1 client': '>= 1.0', 'insert sync 2 clients': '>= 1.0'}


def series_label(cfg, am):
    return '%s/%s' % (SHORT[am], cfg)


def ratio(a, b):
    return a / b if b else float('nan')


def sd_note(sd, n):
    """' (sd x)', or blanks for one measurement (its sd would read 0)."""
    return ' (sd %.3f)' % sd if n > 1 else ' ' * 11


def phase(t0, title):
    """A section header, with the time into the run (for sizing --quick)."""
    log('\n== %s  [%.0f s]' % (title, time.monotonic() - t0))


def rotated(seq, k):
    """seq started at its k-th element: each round of runs starts with
    another method, so that none always follows the same one (a run after
    one that wrote a lot can meet its writeback)."""
    k %= len(seq)
    return seq[k:] + seq[:k]


def prepare_data(args, workdir, rows):
    """The CSV to load (id, box, t) and its number of rows."""
    if args.data == 'porto':
        return generate_data(workdir, rows), rows
    if not args.data_file:
        raise SystemExit('compare --data coast needs --data-file: bench/compare makes it '
                         'with bench/coast_gen.py')
    # the server reads it with COPY, as the PostgreSQL user: a copy in the
    # work directory is certainly readable
    path = os.path.join(workdir, os.path.basename(args.data_file))
    shutil.copyfile(args.data_file, path)
    with open(path) as f:
        n = sum(1 for _ in f)
    return path, n


def data_shape(cl, table, nrows, spread, sample=1000):
    """Box sizes against the data space, and how many other boxes a box
    meets (over a sample, through the index): the coastline boxes meet
    their two neighbours and little else, taxi boxes pile up downtown."""
    step = max(1, nrows // sample)
    w50, w99, h50, h99, zero = (float(x) for x in cl.rows(f"""
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY width(b)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY width(b)),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY height(b)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY height(b)),
       avg((area(b) = 0)::int)
FROM src""")[0])
    met = cl.sql(f"""
SET enable_seqscan = off;
SELECT avg((SELECT count(*) FROM {table} t WHERE t.b && s.b) - 1),
       max((SELECT count(*) FROM {table} t WHERE t.b && s.b) - 1)
FROM src s WHERE s.id % {step} = 0""").splitlines()[-1].split('|')
    shape = {'width_p50': w50, 'width_p99': w99, 'height_p50': h50, 'height_p99': h99,
             'zero_area': zero, 'met_mean': float(met[0]), 'met_max': int(met[1]),
             'spread': spread}
    log('  width  median %.3g (%.3g %% of the data space), p99 %.3g;  height median %.3g '
        '(%.3g %%), p99 %.3g;  zero area: %.1f %%'
        % (w50, 100 * w50 / spread[0], w99, h50, 100 * h50 / spread[1], h99, 100 * zero))
    log('  a box meets %.1f other boxes on average (max %d; over every %d-th box)'
        % (shape['met_mean'], shape['met_max'], step))
    return shape


def cmd_compare(args):
    quick = args.quick
    configs = ['shm', 'disk'] if args.config == 'both' else [args.config]
    rows = args.rows or (100000 if quick else 1000000)
    # --quick: builds and bulk inserts once, but pgbench as three 1-second
    # rounds through all the methods rather than one 3-second run each, so
    # that the machine's slow spells (the virtual disk's fsync latency
    # wanders by 2x within seconds) fall on every method alike; restarts
    # twice (they take about half a second)
    seconds = args.seconds or (1 if quick else 10)
    reps = args.reps or (1 if quick else 3)
    rounds = args.reps or 3
    restarts = args.reps or (2 if quick else 3)
    clients = args.clients
    sels = QUICK_SELECTIVITIES if quick else SELECTIVITIES
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    outdir = os.path.join(args.results, 'compare-' + stamp)
    res = Results(outdir, 'compare')
    info = machine_info()
    print_machine(info, configs)
    csvpath, rows = prepare_data(args, args.workdir, rows)
    # --quick inserts half the rows in bulk (with the msync disk pool of
    # earlier versions an amrtree index cost ~100x GiST's per row there,
    # which alone took --config both past four minutes)
    bulk_rows = min(args.bulk_rows or (rows // 2 if quick else rows), rows)
    log('compare: %d %s rows, configuration%s %s, %d client(s), %d repetition(s) of builds '
        'and bulk inserts, %d round(s) of %d s pgbench runs, %d restart(s)%s'
        % (rows, 'Porto-like' if args.data == 'porto' else 'GSHHG coastline',
           's' if len(configs) > 1 else '', ' and '.join(configs), clients, reps, rounds,
           seconds, restarts, ' (quick)' if quick else ''))
    pool_mb = max(256, int(rows * ENTRY_BYTES * 4 / 1048576) * 3 + 256)
    # one cluster per configuration, both up for the whole run, so that
    # every measurement interleaves them: the disk pool and
    # synchronous_commit are server settings
    clusters = {}
    for i, cfg in enumerate(configs):
        clusters[cfg] = Cluster(args.workdir, 'compare-' + cfg, pool_mb, pool_mb,
                                pool_on_shm=(cfg == 'shm'),
                                synchronous_commit='off' if cfg == 'shm' else 'on',
                                port_offset=i)
    series = [(cfg, am) for cfg in configs for am in AMS]
    summary = {'machine': info, 'data': args.data, 'rows': rows, 'clients': clients,
               'seconds': seconds, 'reps': reps, 'rounds': rounds, 'restarts': restarts,
               'bulk_rows': bulk_rows, 'configs': configs,
               'config_notes': {c: CONFIG_NOTE[c] for c in configs},
               'results': {c: {} for c in configs}}
    out = summary['results']
    try:
        t0 = time.monotonic()
        for cfg, cl in clusters.items():
            cl.start()
            os.makedirs(os.path.join(cl.dir, 'pgbench-logs'), exist_ok=True)
            load_source(cl, csvpath)
            ncenters = make_centers(cl)
            for am in AMS:
                # no autovacuum on the measured tables: VACUUM runs where the
                # driver says, and writes no WAL inside a measurement
                cl.sql(f'CREATE TABLE trips_{am} AS SELECT * FROM src ORDER BY id; '
                       f'ALTER TABLE trips_{am} SET (autovacuum_enabled = off)')
        if args.data == 'coast':
            os.unlink(csvpath)      # loaded; the cache in bench/data/ stays
        centres = {cfg: cl.sql('SELECT sum(x), sum(y) FROM bench_centers')
                   for cfg, cl in clusters.items()}
        if len(set(centres.values())) > 1:
            log('warning: the configurations drew different query centres: %s' % centres)
        cl0 = clusters[configs[0]]

        # -- build time, WAL and size (interleaved repetitions)
        phase(t0, 'index build (time; WAL written by CREATE INDEX, bytes per row; size)')
        builds = {k: [] for k in series}
        bwal = {k: [] for k in series}
        for rep in range(reps):
            for cfg, am in series:
                cl, t = clusters[cfg], 'trips_' + am
                cl.sql(f'DROP INDEX IF EXISTS {t}_b; CHECKPOINT')
                w0 = cl.wal_pos()
                builds[(cfg, am)].append(cl.timed(INDEX_DDL[am].format(t=t)))
                bwal[(cfg, am)].append((cl.wal_pos() - w0) / rows)
        for cfg, am in series:
            cl, t = clusters[cfg], 'trips_' + am
            cl.sql(f'VACUUM ANALYZE {t}')
            if am.startswith('amrtree'):
                # measure the placement the tier manager keeps (with an
                # unlimited budget and room in the pool: every leaf on
                # PMEM; rule R5 demotes only above the pool's high watermark)
                cl.sql(f"SELECT amrtree_settle('{t}_b', 1)")
            size = index_bytes(cl, am, t)
            m, sd = mean_sd(builds[(cfg, am)])
            w, _ = mean_sd(bwal[(cfg, am)])
            r = out[cfg]
            r.setdefault('build_s', {})[am] = m
            r.setdefault('build_wal_per_row', {})[am] = w
            r.setdefault('size_bytes', {})[am] = size
            res.add(config=cfg, metric='build_time', am=am, value=m, sd=sd, unit='s')
            res.add(config=cfg, metric='build_wal_per_row', am=am, value=w, unit='bytes')
            res.add(config=cfg, metric='index_size', am=am, value=size['total'], unit='bytes',
                    detail='dram=%(dram)d pmem=%(pmem)d ssd=%(ssd)d' % size)
            log('  %-17s build %7.3f s%s  WAL %7.1f B/row  size %7.1f MB%s'
                % (series_label(cfg, am), m, sd_note(sd, reps), w, size['total'] / 1048576,
                   '  (DRAM %.2f + PMEM %.1f + SSD %.1f)'
                   % (size['dram'] / 1048576, size['pmem'] / 1048576,
                      size['ssd'] / 1048576) if am.startswith('amrtree') else ''))

        # -- the data, and the query windows
        spread = data_spread(cl0)
        phase(t0, 'data: %d %s boxes' % (rows, args.data))
        summary['data_shape'] = data_shape(cl0, 'trips_gist', rows, spread)
        log('\n== query windows (centred on data boxes; selectivity = window area / data space area)')
        windows = make_windows(cl0, 'trips_amrtree', rows, spread, sels)
        summary['windows'] = {pct(s): {'hw': w[0], 'hh': w[1], 'mean_rows': w[2]}
                              for s, w in windows.items()}
        bw, bh = [float(x) for x in cl0.rows(
            "SELECT avg(width(b)), avg(height(b)) FROM src")[0]]

        log('\n== plans chosen by the planner (one window per selectivity)')
        summary['plans'] = {}
        for s in sels:
            plans = {series_label(cfg, am): plan_of(clusters[cfg], 'trips_' + am,
                                                    windows[s][0], windows[s][1])
                     for cfg, am in series}
            summary['plans'][pct(s)] = plans
            kinds = sorted(set(plans.values()))
            log('  %-7s %s' % (pct(s), 'every method: ' + kinds[0] if len(kinds) == 1 else
                               '  '.join('%s: %s' % kv for kv in plans.items())))

        # -- queries
        runs = [('range %s' % pct(s), ['range.sql'],
                 {'hw': windows[s][0], 'hh': windows[s][1], 'n': ncenters}) for s in sels]
        if not quick:
            hw, hh = windows[0.0001][0], windows[0.0001][1]
            runs.append(('skewed 0.01%', ['skewed.sql'], {'hw': hw, 'hh': hh, 'n': ncenters,
                                                           'nhot': min(1000, ncenters)}))
        phase(t0, 'pgbench (tps; latency avg / p95 / p99 in ms; %d round(s) of %d s)'
              % (rounds, seconds))
        qres = {}
        for label, scripts, defs in runs:
            for rnd in range(rounds):
                for cfg, am in rotated(series, rnd):
                    cl = clusters[cfg]
                    r = cl.pgbench([os.path.join(SCRIPTS, x) for x in scripts], clients,
                                   seconds=seconds, defines=dict(defs, tbl='trips_' + am),
                                   tag='q', logdir=os.path.join(cl.dir, 'pgbench-logs'))
                    qres.setdefault((label, cfg, am), []).append(r)
            report_runs(res, out, qres, label, configs)
        # the same two smallest windows through prepared statements: no
        # parse or plan per query, as an application that prepares its
        # statements sees them (docs/evaluation.md, the coastline misses)
        for sel in sels[:2]:
            label = 'range %s prepared' % pct(sel)
            defs = {'hw': windows[sel][0], 'hh': windows[sel][1], 'n': ncenters}
            for rnd in range(rounds):
                for cfg, am in rotated(series, rnd):
                    cl = clusters[cfg]
                    r = cl.pgbench([table_script(cl, 'range.sql', 'trips_' + am)], clients,
                                   seconds=seconds, defines=defs, tag='q', protocol='prepared',
                                   logdir=os.path.join(cl.dir, 'pgbench-logs'))
                    qres.setdefault((label, cfg, am), []).append(r)
            report_runs(res, out, qres, label, configs)
        # the two smallest windows: where the per-query and per-row costs
        # that every index pays are most of the time
        for sel in sels[:2]:
            measure_floor(clusters, configs, windows[sel], sel, ncenters,
                          rounds, seconds, clients, out, res)

        # -- KNN: ORDER BY b <-> point LIMIT 10 (pgbench), and a
        # nearest-neighbour join of 10,000 probes (LATERAL ... LIMIT 1), for
        # the methods whose plan orders by the index
        knn_ams = []
        for am in AMS:
            plan = cl0.sql(f'EXPLAIN (COSTS OFF) SELECT 1 FROM trips_{am} '
                           f'ORDER BY b <-> point(0, 0) LIMIT 10')
            if 'Order By' in plan:
                knn_ams.append(am)
            else:
                log('  (KNN: %s does not order by the index here; not measured)' % AM_LABEL[am])
        knn_series = [(cfg, am) for cfg, am in series if am in knn_ams]
        for rnd in range(rounds):
            for cfg, am in rotated(knn_series, rnd):
                cl = clusters[cfg]
                r = cl.pgbench([os.path.join(SCRIPTS, 'knn.sql')], clients, seconds=seconds,
                               defines={'n': ncenters, 'tbl': 'trips_' + am}, tag='k',
                               logdir=os.path.join(cl.dir, 'pgbench-logs'))
                qres.setdefault(('knn k=10', cfg, am), []).append(r)
        report_runs(res, out, qres, 'knn k=10', configs)
        # the same on points (the boxes' centres), in a table per method
        pt_ams = [am for am in ('amrtree', 'gist', 'spgist') if am in AMS]
        for cfg, cl in clusters.items():
            for am in pt_ams:
                cl.sql(f'DROP TABLE IF EXISTS pts_{am}; '
                       f'CREATE TABLE pts_{am} AS SELECT id, center(b) AS p FROM src ORDER BY id; '
                       f'ALTER TABLE pts_{am} SET (autovacuum_enabled = off); '
                       f'CREATE INDEX ON pts_{am} USING {am} (p); VACUUM ANALYZE pts_{am}')
        pt_series = [(cfg, am) for cfg, am in series if am in pt_ams]
        for rnd in range(rounds):
            for cfg, am in rotated(pt_series, rnd):
                cl = clusters[cfg]
                r = cl.pgbench([os.path.join(SCRIPTS, 'knn_points.sql')], clients, seconds=seconds,
                               defines={'n': ncenters, 'tbl': 'pts_' + am}, tag='kp',
                               logdir=os.path.join(cl.dir, 'pgbench-logs'))
                qres.setdefault(('knn points k=10', cfg, am), []).append(r)
        report_runs(res, out, qres, 'knn points k=10', configs)
        for cfg, cl in clusters.items():
            cl.sql('DROP TABLE ' + ', '.join('pts_' + am for am in pt_ams))
        # PostGIS: the same boxes as geometries, amrtree_postgis against
        # PostGIS's own GiST index (gist_geometry_ops_2d), where installed
        if cl0.sql("SELECT count(*) FROM pg_available_extensions WHERE name = 'amrtree_postgis'") == '1':
            geo_ams = ['amrtree', 'gist']
            gbuild = {(cfg, am): [] for cfg in configs for am in geo_ams}
            for cfg, cl in clusters.items():
                cl.sql('CREATE EXTENSION IF NOT EXISTS amrtree_postgis CASCADE')
                for am in geo_ams:
                    cl.sql(f'DROP TABLE IF EXISTS geo_{am}; CREATE TABLE geo_{am} AS '
                           f'SELECT id, ST_MakeEnvelope((b[1])[0], (b[1])[1], (b[0])[0], (b[0])[1]) AS g '
                           f'FROM src ORDER BY id; ALTER TABLE geo_{am} SET (autovacuum_enabled = off)')
            for rep in range(reps):
                for cfg, am in [(c, a) for c in configs for a in geo_ams]:
                    cl = clusters[cfg]
                    cl.sql(f'DROP INDEX IF EXISTS geo_{am}_g; CHECKPOINT')
                    gbuild[(cfg, am)].append(cl.timed(f'CREATE INDEX geo_{am}_g ON geo_{am} USING {am} (g)'))
            for cfg, cl in clusters.items():
                for am in geo_ams:
                    cl.sql(f'VACUUM ANALYZE geo_{am}')
                    if am == 'amrtree':
                        cl.sql(f"SELECT amrtree_settle('geo_{am}_g', 1)")
            def report_builds(key, metric, what):
                for cfg in configs:
                    m = {am: mean_sd(gbuild[(cfg, am)])[0] for am in geo_ams}
                    out[cfg][key] = m
                    for am in geo_ams:
                        res.add(config=cfg, metric=metric, am=am, value=m[am], unit='s')
                    log('  %s build %-4s amrtree %.3f s  GiST %.3f s  (GiST time / amrtree time %.2f)'
                        % (what, cfg, m['amrtree'], m['gist'], ratio(m['gist'], m['amrtree'])))

            report_builds('postgis_build_s', 'postgis_build_time', 'PostGIS')
            geo_series = [(cfg, am) for cfg in configs for am in geo_ams]
            # the windows through && (geo_range.sql), then through
            # ST_Intersects with no && written (geo_intersects.sql)
            for script, name, tag in [('geo_range.sql', 'postgis &&', 'g'),
                                      ('geo_intersects.sql', 'postgis ST_Intersects', 'gi')]:
                for s_ in sels:
                    label = '%s %s' % (name, pct(s_))
                    for rnd in range(rounds):
                        for cfg, am in rotated(geo_series, rnd):
                            cl = clusters[cfg]
                            r = cl.pgbench([os.path.join(SCRIPTS, script)], clients,
                                           seconds=seconds,
                                           defines={'n': ncenters, 'tbl': 'geo_' + am,
                                                    'hw': windows[s_][0], 'hh': windows[s_][1]},
                                           tag=tag, logdir=os.path.join(cl.dir, 'pgbench-logs'))
                            qres.setdefault((label, cfg, am), []).append(r)
                    report_runs(res, out, qres, label, configs)
            for cfg, cl in clusters.items():
                cl.sql('DROP TABLE geo_amrtree, geo_gist')
            # geography (amrtree_postgis 0.2): each box's diagonal as a
            # line on the sphere; ST_DWithin at two radii and KNN, against
            # PostGIS's gist_geography_ops
            gbuild = {(cfg, am): [] for cfg in configs for am in geo_ams}
            for cfg, cl in clusters.items():
                for am in geo_ams:
                    cl.sql(f'DROP TABLE IF EXISTS geog_{am}; CREATE TABLE geog_{am} AS '
                           f'SELECT id, ST_MakeLine(ST_MakePoint((b[1])[0], (b[1])[1]), '
                           f'ST_MakePoint((b[0])[0], (b[0])[1]))::geography AS g '
                           f'FROM src ORDER BY id; ALTER TABLE geog_{am} SET (autovacuum_enabled = off); '
                           f'CHECKPOINT')
                    gbuild[(cfg, am)].append(cl.timed(f'CREATE INDEX geog_{am}_g ON geog_{am} USING {am} (g)'))
                    cl.sql(f'VACUUM ANALYZE geog_{am}')
                    if am == 'amrtree':
                        cl.sql(f"SELECT amrtree_settle('geog_{am}_g', 1)")
            report_builds('geography_build_s', 'geography_build_time', 'geography')
            for script, label, defines in [('geog_dwithin.sql', 'geography ST_DWithin 1 km', {'r': 1000}),
                                           ('geog_dwithin.sql', 'geography ST_DWithin 20 km', {'r': 20000}),
                                           ('geog_knn.sql', 'geography KNN k=10', {})]:
                for rnd in range(rounds):
                    for cfg, am in rotated(geo_series, rnd):
                        cl = clusters[cfg]
                        r = cl.pgbench([os.path.join(SCRIPTS, script)], clients, seconds=seconds,
                                       defines=dict(defines, n=ncenters, tbl='geog_' + am),
                                       tag='gg', logdir=os.path.join(cl.dir, 'pgbench-logs'))
                        qres.setdefault((label, cfg, am), []).append(r)
                report_runs(res, out, qres, label, configs)
            for cfg, cl in clusters.items():
                cl.sql('DROP TABLE geog_amrtree, geog_gist')
        else:
            log('  (PostGIS: amrtree_postgis is not available here; not measured)')
        nprobes = min(10000, ncenters)
        join = {k: [] for k in knn_series}
        for rnd in range(rounds):
            for cfg, am in rotated(knn_series, rnd):
                join[(cfg, am)].append(clusters[cfg].timed(
                    f'SELECT count(n.*) FROM (SELECT point(x, y) AS p FROM bench_centers '
                    f'WHERE id <= {nprobes}) probes CROSS JOIN LATERAL '
                    f'(SELECT 1 FROM trips_{am} ORDER BY b <-> probes.p LIMIT 1) n'))
        for cfg, am in knn_series:
            m, sd = mean_sd(join[(cfg, am)])
            out[cfg].setdefault('nn_join_s', {})[am] = m
            res.add(config=cfg, metric='nn_join', am=am, value=m, sd=sd, unit='s',
                    detail='%d probes' % nprobes)
            log('  %-17s nearest-neighbour join of %d probes %7.3f s%s'
                % (series_label(cfg, am), nprobes, m, sd_note(sd, rounds)))

        # -- spatial join: a nested loop whose inner side is an index scan on
        # `&&`, rescanned once per probe (probes are data boxes, so each
        # finds at least itself)
        nsj = min(20000, rows)
        for cfg, cl in clusters.items():
            cl.sql(f"""
DROP TABLE IF EXISTS bench_probes;
SELECT setseed(0.24);
CREATE TABLE bench_probes AS SELECT b FROM src ORDER BY random() LIMIT {nsj};
ANALYZE bench_probes;""")
        sj_sql = 'SELECT count(*) FROM bench_probes p JOIN trips_{am} t ON t.b && p.b'
        plans = {series_label(cfg, am): ' / '.join(
            l.strip().lstrip('-> ').split('  ')[0] for l in clusters[cfg].sql(
                'EXPLAIN (COSTS OFF) ' + sj_sql.format(am=am)).splitlines()
            if 'Scan' in l or 'Loop' in l or 'Join' in l)
                 for cfg, am in series}
        summary['plans']['spatial join'] = plans
        log('  spatial join plans: %s' % '  '.join('%s: %s' % kv for kv in plans.items()))
        sjoin = {k: [] for k in series}
        for rnd in range(rounds):
            for cfg, am in rotated(series, rnd):
                sjoin[(cfg, am)].append(clusters[cfg].timed(sj_sql.format(am=am)))
        for cfg, am in series:
            m, sd = mean_sd(sjoin[(cfg, am)])
            out[cfg].setdefault('spatial_join_s', {})[am] = m
            res.add(config=cfg, metric='spatial_join', am=am, value=m, sd=sd, unit='s',
                    detail='%d probes' % nsj)
            log('  %-17s spatial join (&&) of %d probes %7.3f s%s'
                % (series_label(cfg, am), nsj, m, sd_note(sd, rounds)))

        # -- single-row inserts (these grow the tables, so they come after
        # every read-only measurement: a full run inserts hundreds of
        # thousands of copies of boxes at the 10,000 centres, and KNN and the
        # joins measured after that measured those duplicates, not the data
        # loaded -- until 2026-11-25 they came before): with
        # synchronous_commit = on, what a durable application sees, and
        # off, where the index's own cost is not hidden by the WAL flush
        ins_defs = {'n': ncenters, 'bw': bw, 'bh': bh}
        ins_runs = [('insert sync 1 client', 1, 'on'), ('insert sync 2 clients', 2, 'on'),
                    ('insert async %d client%s' % (clients, 's' if clients > 1 else ''),
                     clients, 'off')]
        iwal = {k: [0, 0] for k in series}      # bytes, rows
        for label, ncl, sync in ins_runs:
            for rnd in range(rounds):
                for cfg, am in rotated(series, rnd):
                    cl = clusters[cfg]
                    w0 = cl.wal_pos()
                    r = cl.pgbench([os.path.join(SCRIPTS, 'insert.sql')], ncl, seconds=seconds,
                                   defines=dict(ins_defs, tbl='trips_' + am), tag='i',
                                   logdir=os.path.join(cl.dir, 'pgbench-logs'),
                                   gucs={'synchronous_commit': sync})
                    r['wal'] = cl.wal_pos() - w0
                    iwal[(cfg, am)][0] += r['wal']
                    iwal[(cfg, am)][1] += r['tx']
                    qres.setdefault((label, cfg, am), []).append(r)
            report_runs(res, out, qres, label, configs)
        for cfg, am in series:
            w = ratio(*iwal[(cfg, am)])
            out[cfg].setdefault('insert_wal_per_row', {})[am] = w
            res.add(config=cfg, metric='insert_wal_per_row', am=am, value=w, unit='bytes',
                    detail='%d rows' % iwal[(cfg, am)][1])
        for cfg in configs:
            log('  %-22s %-4s %s' % ('WAL per inserted row' if cfg == configs[0] else '', cfg,
                                     '  '.join('%s %.0f B' % (SHORT[am], out[cfg]['insert_wal_per_row'][am])
                                               for am in AMS)))
        if not quick:
            hw, hh = windows[0.0001][0], windows[0.0001][1]
            for rnd in range(rounds):
                for cfg, am in rotated(series, rnd):
                    cl = clusters[cfg]
                    r = cl.pgbench([os.path.join(SCRIPTS, 'range.sql') + '@8',
                                    os.path.join(SCRIPTS, 'insert.sql') + '@2'], clients,
                                   seconds=seconds,
                                   defines=dict(ins_defs, tbl='trips_' + am, hw=hw, hh=hh),
                                   tag='m', logdir=os.path.join(cl.dir, 'pgbench-logs'))
                    qres.setdefault(('mixed 80/20', cfg, am), []).append(r)
            report_runs(res, out, qres, 'mixed 80/20', configs)

        # -- bulk insert: INSERT ... SELECT with the index present vs no index
        phase(t0, 'bulk insert: INSERT ... SELECT of %d rows into an empty table (time; WAL per row)'
              % bulk_rows)
        bulk = {(cfg, k): [] for cfg in configs for k in ['none'] + AMS}
        bulkwal = {k: [] for k in bulk}
        for rep in range(reps):
            for cfg in configs:
                cl = clusters[cfg]
                for am in ['none'] + AMS + ['none']:
                    cl.sql('DROP TABLE IF EXISTS bulk; CREATE TABLE bulk (id int, b box, t float8) '
                           'WITH (autovacuum_enabled = off)')
                    if am != 'none':
                        cl.sql(INDEX_DDL[am].format(t='bulk'))
                    cl.sql('CHECKPOINT')
                    w0 = cl.wal_pos()
                    bulk[(cfg, am)].append(cl.timed(
                        f'INSERT INTO bulk SELECT * FROM src WHERE id <= {bulk_rows}'))
                    bulkwal[(cfg, am)].append((cl.wal_pos() - w0) / bulk_rows)
                cl.sql('DROP TABLE bulk; CHECKPOINT')
        for cfg in configs:
            base, base_sd = mean_sd(bulk[(cfg, 'none')])
            base_wal, _ = mean_sd(bulkwal[(cfg, 'none')])
            r = out[cfg]
            r['bulk'] = {'none': base}
            r['bulk_wal_per_row'] = {'none': base_wal}
            res.add(config=cfg, metric='bulk_insert', am='none', value=base, sd=base_sd, unit='s')
            res.add(config=cfg, metric='bulk_wal_per_row', am='none', value=base_wal, unit='bytes')
            log('  %-17s %7.3f s%s                                WAL %6.1f B/row'
                % ('no index/' + cfg, base, sd_note(base_sd, reps), base_wal))
            for am in AMS:
                m, sd = mean_sd(bulk[(cfg, am)])
                w, _ = mean_sd(bulkwal[(cfg, am)])
                cost = m - base
                r['bulk'][am] = m
                r['bulk_wal_per_row'][am] = w
                res.add(config=cfg, metric='bulk_insert', am=am, value=m, sd=sd, unit='s')
                res.add(config=cfg, metric='bulk_index_cost', am=am, value=cost, unit='s')
                res.add(config=cfg, metric='bulk_wal_per_row', am=am, value=w, unit='bytes')
                log('  %-17s %7.3f s%s  index cost %7.3f s = %6.2f us/row  WAL %6.1f B/row'
                    % (series_label(cfg, am), m, sd_note(sd, reps), cost, cost / bulk_rows * 1e6, w))

        # -- VACUUM: the index's share of removing 1 % of the rows
        measure_vacuum(clusters, configs, bulk_rows, reps, res, out, t0)

        # -- restart: a clean restart, then the first query that uses the index
        hw, hh = windows[sels[0]][0], windows[sels[0]][1]
        x, y = (float(v) for v in cl0.rows('SELECT x, y FROM bench_centers WHERE id = 1')[0])
        phase(t0, 'restart to first query: a fast shutdown, a start, and an index scan of the '
              'table (after a CHECKPOINT)')
        rst = {k: [] for k in series}
        for rep in range(restarts):
            for cfg, am in rotated(series, rep):
                rst[(cfg, am)].append(clusters[cfg].restart_to_first_query(
                    f"SET enable_seqscan = off;\n"
                    f"SELECT count(*) FROM trips_{am} WHERE b && "
                    f"box(point({x - hw!r}, {y - hh!r}), point({x + hw!r}, {y + hh!r}));"))
        for cfg, am in series:
            ts = rst[(cfg, am)]
            total, total_sd = mean_sd([t[0] + t[1] for t in ts])
            stop, _ = mean_sd([t[0] for t in ts])
            start, _ = mean_sd([t[1] for t in ts])
            first, _ = mean_sd([t[2] for t in ts])
            out[cfg].setdefault('restart', {})[am] = {
                'to_first_result_s': total, 'stop_s': stop, 'start_to_first_result_s': start,
                'first_query_s': first}
            res.add(config=cfg, metric='restart_to_first_query', am=am, value=total,
                    sd=total_sd, unit='s', detail='stop %.4f start %.4f' % (stop, start))
            res.add(config=cfg, metric='first_query_after_restart', am=am, value=first, unit='s')
            log('  %-17s %7.3f s%s = stop %.3f + start to first result %.3f;  first query %.4f s'
                % (series_label(cfg, am), total, sd_note(total_sd, len(ts)), stop, start, first))
        summary['elapsed_s'] = time.monotonic() - t0

        info['loadavg_end'] = [round(x, 2) for x in os.getloadavg()]
        print_compare_ratios(summary, res)
        csvp = res.write_csv()
        with open(os.path.join(outdir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=1, default=str)
        plot_compare(summary, outdir)
        log('\nresults: %s (CSV), summary.json, compare-tps.png in %s' % (csvp, outdir))
        log('elapsed: %.0f s; load average %s at the end (the run itself keeps it near %d)'
            % (summary['elapsed_s'], info['loadavg_end'], clients))
    finally:
        for cl in clusters.values():
            cl.remove()


def table_script(cl, name, tbl):
    """A copy of bench/scripts/<name> in the cluster's directory with :tbl
    written in: a prepared statement cannot take a table name as a
    parameter."""
    with open(os.path.join(SCRIPTS, name)) as fh:
        text = fh.read()
    path = os.path.join(cl.dir, '%s-%s' % (tbl, name))
    with open(path, 'w') as fh:
        fh.write(text.replace(':tbl', tbl))
    return path


def measure_floor(clusters, configs, window, sel, ncenters, rounds, seconds,
                  clients, out, res):
    """The most any index could gain at a small window: the same range
    query (same script, same windows) on a table of as many rows as the
    window returns on average, every one of them met by every window, so
    that every entry the index reads is a result.  What that costs is
    parse, plan, executor, visibility checks and the protocol -- the part
    that does not depend on the index.  Its tps over GiST's on the real
    table bounds the ratio any index can reach there (docs/evaluation.md,
    the coastline misses)."""
    nrows = max(1, int(round(window[2])))
    ams = ['amrtree', 'gist']
    for cl in clusters.values():
        for am in ams:
            t = 'floor_%s_%d' % (am, nrows)
            cl.sql(f"DROP TABLE IF EXISTS {t}; "
                   f"CREATE TABLE {t} AS SELECT g AS id, "
                   f"box(point(-1e9, -1e9), point(1e9, 1e9)) AS b FROM generate_series(1, {nrows}) g; "
                   f"ALTER TABLE {t} SET (autovacuum_enabled = off); "
                   + INDEX_DDL[am].format(t=t) + f"; VACUUM ANALYZE {t}")
    label = 'range %s floor' % pct(sel)
    runs = {}
    pairs = [(cfg, am) for cfg in configs for am in ams]
    for rnd in range(rounds):
        for cfg, am in rotated(pairs, rnd):
            cl = clusters[cfg]
            # a tiny table: without these the planner would scan it; the
            # transaction log as in the real runs, which pay for it too
            r = cl.pgbench([os.path.join(SCRIPTS, 'range.sql')], clients, seconds=seconds,
                           defines={'hw': window[0], 'hh': window[1], 'n': ncenters,
                                    'tbl': 'floor_%s_%d' % (am, nrows)},
                           gucs={'enable_seqscan': 'off', 'enable_bitmapscan': 'off'},
                           tag='f', logdir=os.path.join(cl.dir, 'pgbench-logs'))
            runs.setdefault((cfg, am), []).append(r['tps'])
    log('\n== the floor at the %s window: the same query on %d rows that every window meets '
        '(every entry the index reads is a result)' % (pct(sel), nrows))
    for cfg in configs:
        real = out[cfg]['tps']['range %s' % pct(sel)]
        floor = {am: mean_sd(runs[(cfg, am)])[0] for am in ams}
        best = max(floor.values())
        this = {'rows': nrows, 'tps': floor,
                'ceiling_vs_gist': ratio(best, real['gist']['tps']),
                'amrtree_vs_gist': ratio(real['amrtree']['tps'], real['gist']['tps'])}
        # 'floor' stays the smallest window's, as before; 'floors' has each
        out[cfg].setdefault('floor', this)
        out[cfg].setdefault('floors', {})[pct(sel)] = this
        for am in ams:
            res.add(config=cfg, metric='tps', script=label, am=am, value=floor[am], unit='tps')
        res.add(config=cfg, metric='floor_ratio_to_gist', script=label, am='any',
                value=this['ceiling_vs_gist'], unit='x')
        log('  %-4s floor tps amrtree %.0f, GiST %.0f; on the real table GiST %.0f, amrtree %.0f:'
            ' an index with no work of its own would be about %.2fx GiST here (amrtree %.2fx)'
            % (cfg, floor['amrtree'], floor['gist'], real['gist']['tps'], real['amrtree']['tps'],
               this['ceiling_vs_gist'], this['amrtree_vs_gist']))


def report_runs(res, out, qres, label, configs):
    for cfg in configs:
        per = out[cfg].setdefault('tps', {}).setdefault(label, {})
        for am in AMS:
            if (label, cfg, am) not in qres:
                continue        # e.g. KNN where the method cannot order by its index
            rs = qres[(label, cfg, am)]
            t, sd = mean_sd([r['tps'] for r in rs])
            lat = lat_summary([x for r in rs for x in r['lat']])
            per[am] = {'tps': t, 'sd': sd, **lat}
            extra = {}
            if 'wal' in rs[0]:
                extra['wal_per_row'] = ratio(sum(r['wal'] for r in rs), sum(r['tx'] for r in rs))
                per[am]['wal_per_row'] = extra['wal_per_row']
            res.add(config=cfg, metric='tps', script=label, am=am, value=t, sd=sd, unit='tps',
                    lat_avg_ms=lat['avg'], lat_p95_ms=lat['p95'], lat_p99_ms=lat['p99'], **extra)
        log('  %-22s %-4s %s' % (label if cfg == configs[0] else '', cfg, '  '.join(
            '%s %7.0f (%.2f/%.2f/%.2f)' % (SHORT[am], per[am]['tps'], per[am]['avg'],
                                           per[am]['p95'], per[am]['p99'])
            for am in AMS if am in per)))


# VACUUM's extra series: amrtree with 90 % of its leaves on the SSD tier
VACUUM_SSD = 'amrtree_ssd90'
VACUUM_DDL = dict(INDEX_DDL, **{
    VACUUM_SSD: "CREATE INDEX {t}_b ON {t} USING amrtree (b) WITH (pmem_budget = '10%');\n"
                "SELECT amrtree_settle('{t}_b', 0)"})


def measure_vacuum(clusters, configs, nrows, reps, res, out, t0):
    """VACUUM (INDEX_CLEANUP ON) after deleting every 100th row of a fresh,
    frozen table of nrows rows; an index's cost is the time beyond VACUUM of
    the same table without an index.  Also amrtree with 90 % of its leaves
    on SSD, whose leaves VACUUM rewrites out of place."""
    phase(t0, 'VACUUM (INDEX_CLEANUP ON) after deleting 1 %% of %d rows (every 100th id); '
          'index cost = time beyond VACUUM without an index' % nrows)
    ams = AMS + [VACUUM_SSD]
    times = {(cfg, k): [] for cfg in configs for k in ['none'] + ams}
    for rep in range(reps):
        for cfg in configs:
            cl = clusters[cfg]
            for am in ['none'] + ams + ['none']:
                cl.sql('DROP TABLE IF EXISTS vac;\n'
                       'CREATE TABLE vac (id int, b box, t float8) WITH (autovacuum_enabled = off);\n'
                       f'INSERT INTO vac SELECT * FROM src WHERE id <= {nrows}')
                if am != 'none':
                    cl.sql(VACUUM_DDL[am].format(t='vac'))
                cl.sql('VACUUM (FREEZE, ANALYZE) vac')
                cl.sql('DELETE FROM vac WHERE id % 100 = 7')
                cl.sql('CHECKPOINT')
                times[(cfg, am)].append(cl.timed('VACUUM (INDEX_CLEANUP ON, TRUNCATE off) vac'))
            cl.sql('DROP TABLE vac; CHECKPOINT')
    for cfg in configs:
        base, base_sd = mean_sd(times[(cfg, 'none')])
        r = out[cfg]
        r['vacuum_s'] = {'none': base}
        res.add(config=cfg, metric='vacuum', am='none', value=base, sd=base_sd, unit='s')
        log('  %-30s %7.3f s%s' % ('no index/' + cfg, base, sd_note(base_sd, reps)))
        for am in ams:
            m, sd = mean_sd(times[(cfg, am)])
            r['vacuum_s'][am] = m
            res.add(config=cfg, metric='vacuum', am=am, value=m, sd=sd, unit='s')
            res.add(config=cfg, metric='vacuum_index_cost', am=am, value=m - base, unit='s')
            label = (series_label(cfg, 'amrtree') + ', 90 % on SSD') if am == VACUUM_SSD \
                else series_label(cfg, am)
            log('  %-30s %7.3f s%s  index cost %7.3f s' % (label, m, sd_note(sd, reps), m - base))


def compare_ratio_lines(r):
    """(what, {am: value / GiST's}, target) for one configuration's results."""
    others = [am for am in AMS if am != 'gist']
    lines = []

    def add(what, values, target=''):
        if 'gist' not in values:
            return
        lines.append((what, {am: ratio(values[am], values['gist']) if am in values else None
                             for am in others}, target))

    b = r['build_s']
    lines.append(('build speed (GiST time / time)',
                  {am: ratio(b['gist'], b[am]) for am in others}, '>= 4'))
    if 'postgis_build_s' in r:
        pb = r['postgis_build_s']
        lines.append(('PostGIS build speed (GiST time / time)',
                      {am: ratio(pb['gist'], pb[am]) if am in pb else None for am in others},
                      '>= 4'))
    if 'geography_build_s' in r:
        pb = r['geography_build_s']
        lines.append(('geography build speed (GiST time / time)',
                      {am: ratio(pb['gist'], pb[am]) if am in pb else None for am in others}, ''))
    add('build WAL per row (bytes / GiST bytes)', r['build_wal_per_row'])
    add('index size (bytes / GiST bytes)', {am: v['total'] for am, v in r['size_bytes'].items()})
    for label, per in r['tps'].items():
        add('tps %s' % label, {am: per[am]['tps'] for am in AMS if am in per},
            TPS_TARGETS.get(label, ''))
    if r.get('nn_join_s', {}).get('gist'):
        j = r['nn_join_s']
        lines.append(('nearest-neighbour join speed (GiST time / time)',
                      {am: ratio(j['gist'], j[am]) if am in j else None for am in others},
                      '>= 2'))
    if r.get('spatial_join_s', {}).get('gist'):
        j = r['spatial_join_s']
        lines.append(('spatial join (&&) speed (GiST time / time)',
                      {am: ratio(j['gist'], j[am]) if am in j else None for am in others},
                      '>= 2.5'))
    add('WAL per row, single-row inserts', r['insert_wal_per_row'], '<= 1')
    bulk = r['bulk']
    add('bulk-insert index cost (cost / GiST cost)',
        {am: bulk[am] - bulk['none'] for am in AMS}, '<= 0.5')
    add('bulk-insert WAL per row (bytes / GiST)', r['bulk_wal_per_row'], '<= 1')
    if 'vacuum_s' in r:
        v = r['vacuum_s']
        add('VACUUM index cost, 1 % deleted (cost / GiST)',
            {am: v[am] - v['none'] for am in AMS})
        if VACUUM_SSD in v and 'gist' in v:
            lines.append(('... amrtree with 90 % of leaves on SSD',
                          {am: ratio(v[VACUUM_SSD] - v['none'], v['gist'] - v['none'])
                           if am == 'amrtree' else None for am in others}, ''))
    add('restart to first query (time / GiST)',
        {am: v['to_first_result_s'] for am, v in r['restart'].items()})
    add('first query after restart (time / GiST)',
        {am: v['first_query_s'] for am, v in r['restart'].items()})
    return lines


def print_compare_ratios(summary, res):
    configs = summary['configs']
    out = summary['results']
    others = [am for am in AMS if am != 'gist']
    log('\n== ratios to GiST in the same configuration (for amrtree higher is better for build '
        'speed and tps, lower for the rest)')
    per_cfg = {cfg: compare_ratio_lines(out[cfg]) for cfg in configs}
    cols = [(cfg, am) for cfg in configs for am in others]
    log('  %-42s %s  %s' % ('', ' '.join('%16s' % series_label(c, a) for c, a in cols),
                            'target (amrtree)'))
    summary['ratios'] = {}
    for i, (what, _, target) in enumerate(per_cfg[configs[0]]):
        vals = {cfg: per_cfg[cfg][i][1] for cfg in configs}
        log('  %-42s %s  %s' % (what, ' '.join('%16.2f' % vals[c][a] if vals[c][a] is not None
                                                else '%16s' % '-' for c, a in cols), target))
        for cfg, am in cols:
            res.add(config=cfg, metric='ratio_to_gist', script=what, am=am, value=vals[cfg][am],
                    unit='x')
    for cfg in configs:
        summary['ratios'][cfg] = [{'what': n, **v, 'target': t} for n, v, t in per_cfg[cfg]]
    if configs != ['shm', 'disk']:
        return
    # the durable default against emulated PMEM, method by method.  GiST
    # and SP-GiST do not use the pool: their ratios are the noise of the
    # run (and the cost of synchronous_commit where a run commits)
    log('\n== disk / shm, per method (GiST and SP-GiST do not use the pool: their ratios show '
        'the noise,\n   and synchronous_commit where it differs)')
    rd, rs = out['disk'], out['shm']
    lines = [('build time', {am: ratio(rd['build_s'][am], rs['build_s'][am]) for am in AMS}, '')]
    for label in rs['tps']:
        lines.append(('tps %s' % label, {am: ratio(rd['tps'][label][am]['tps'],
                                                   rs['tps'][label][am]['tps'])
                                         if am in rs['tps'][label] else float('nan')
                                         for am in AMS},
                      'as GiST' if label.startswith('range') else ''))
    lines.append(('bulk-insert index cost',
                  {am: ratio(rd['bulk'][am] - rd['bulk']['none'], rs['bulk'][am] - rs['bulk']['none'])
                   for am in AMS}, ''))
    lines.append(('restart to first query',
                  {am: ratio(rd['restart'][am]['to_first_result_s'],
                             rs['restart'][am]['to_first_result_s']) for am in AMS}, ''))
    log('  %-42s %s  %s' % ('', ' '.join('%16s' % SHORT[am] for am in AMS), 'target (amrtree)'))
    for what, vals, target in lines:
        log('  %-42s %s  %s' % (what, ' '.join('%16.2f' % vals[am] for am in AMS), target))
        for am in AMS:
            res.add(config='disk/shm', metric='disk_over_shm', script=what, am=am,
                    value=vals[am], unit='x')
    summary['disk_over_shm'] = [{'what': n, **v, 'target': t} for n, v, t in lines]


def plot_compare(summary, outdir):
    plt = plt_or_none()
    if not plt:
        return
    configs = summary['configs']
    out = summary['results']
    labels = list(out[configs[0]]['tps'].keys())
    fig, ax = plt.subplots(figsize=(11, 4.5))
    colors = {'amrtree': '#1f77b4', 'amrtree_notier': '#9ecae1', 'gist': '#ff7f0e',
              'spgist': '#2ca02c'}
    series = [(cfg, am) for cfg in configs for am in AMS]
    width = 0.8 / len(series)
    for i, (cfg, am) in enumerate(series):
        # not every script runs on every method (KNN on points, PostGIS)
        vals = [out[cfg]['tps'][l][am]['tps'] if am in out[cfg]['tps'][l] else 0
                for l in labels]
        errs = [out[cfg]['tps'][l][am]['sd'] if am in out[cfg]['tps'][l] else 0
                for l in labels]
        ax.bar([x + (i - (len(series) - 1) / 2) * width for x in range(len(labels))], vals, width,
               yerr=errs, label=series_label(cfg, am), color=colors[am],
               hatch='//' if cfg == 'disk' else None, edgecolor='white' if cfg == 'disk' else None)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=20)
    ax.set_ylabel('transactions / s')
    ax.set_yscale('log')
    ax.set_title('pgbench throughput, %d %s rows, %s' % (summary['rows'], summary['data'],
                                                       ' and '.join(configs)))
    # eight bars a group: the legend goes beside the plot, not over it
    ax.legend(loc='upper left', bbox_to_anchor=(1.01, 1), fontsize='small')
    save_figure(plt, fig, ax, outdir, 'compare-tps.png')


# ---------------------------------------------------------------- budget sweep

CONFIGS = [('20%', "pmem_budget = '20%'"), ('50%', "pmem_budget = '50%'"),
           ('80%', "pmem_budget = '80%'"), ('unlimited', "pmem_budget = 'unlimited'"),
           ('tiering off', 'tiering = off')]
BATCH = 10


def sweep_index(cl, opts):
    cl.sql(f"""
DROP TABLE IF EXISTS sw;
CREATE TABLE sw (id int, b box, t float8);
CREATE INDEX sw_b ON sw USING amrtree (b) WITH ({opts});
DROP SEQUENCE IF EXISTS sw_seq; CREATE SEQUENCE sw_seq;
CHECKPOINT;""")


def tier_state(cl, index='sw_b'):
    st = {}
    for tier, leaves, nbytes, budget in cl.rows(
            f"SELECT tier, leaves, bytes, budget_bytes FROM amrtree_tier_stats('{index}')"):
        st[tier] = {'leaves': int(leaves), 'bytes': int(nbytes),
                    'budget': int(budget) if budget != '' else None}
    m = cl.rows(f"""SELECT promotions, demotions, bytes_moved, budget_demotions, rule_demotions
FROM amrtree_migration_stats('{index}')""")[0]
    st['promotions'], st['demotions'], st['bytes_moved'], st['budget_demotions'], \
        st['rule_demotions'] = (int(x) for x in m)
    return st


def set_guc(cl, name, value):
    if value is None:
        cl.sql(f'ALTER SYSTEM RESET {name}')
    else:
        cl.sql(f"ALTER SYSTEM SET {name} = '{value}'")
    cl.sql('SELECT pg_reload_conf()')
    time.sleep(0.3)


# bench/growth's fixed window: the half-size issue 14 measured small-window
# queries with at 10M Porto-like rows (0.61x GiST's then)
FIXED_WINDOW_HALF = 0.0002
FIXED_WINDOW_LABEL = 'range +-0.0002deg'


def cmd_growth(args):
    """Cost against rows: for each size, one cluster in the default
    configuration (pool file in the data directory, synchronous_commit on),
    amrtree, GiST and SP-GiST on the same Porto-like rows: build time, index
    bytes per tier, DRAM for inner nodes, the share of leaf bytes on PMEM
    after the tier manager settled (unlimited budget), restart to first
    query, and range-query tps at three window sizes."""
    sizes = [int(x) for x in (args.rows or '1000000,10000000').split(',')]
    seconds = args.seconds or 5
    clients = args.clients
    sels = [0.00001, 0.001, 0.01]
    ams = ['amrtree', 'gist', 'spgist']
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    outdir = os.path.join(args.results, 'growth-' + stamp)
    res = Results(outdir, 'growth')
    info = machine_info()
    print_machine(info, ['disk'])
    summary = {'machine': info, 'sizes': sizes, 'seconds': seconds, 'clients': clients,
               'config': CONFIG_NOTE['disk'],
               'maintenance_work_mem': args.maintenance_work_mem or '1GB', 'results': {}}
    t0 = time.monotonic()
    for rows in sizes:
        csvpath = generate_data(args.workdir, rows)
        # a pool with room for every leaf (leaves at 90 % of 84 entries)
        pool_mb = max(256, int(rows * 4096 / 75 / 1048576 * 1.3) + 256)
        cl = Cluster(args.workdir, 'growth', pool_mb, pool_mb, pool_on_shm=False,
                     synchronous_commit='on',
                     extra_conf=("maintenance_work_mem = '%s'" % args.maintenance_work_mem
                                 if args.maintenance_work_mem else ''))
        r = summary['results'][rows] = {'pool_mb': pool_mb}
        try:
            cl.start()
            phase(t0, '%d rows (amrtree.pmem_size = %d MB)' % (rows, pool_mb))
            load_source(cl, csvpath)
            ncenters = make_centers(cl)
            for am in ams:
                cl.sql(f'CREATE TABLE trips_{am} AS SELECT * FROM src ORDER BY id; '
                       f'ALTER TABLE trips_{am} SET (autovacuum_enabled = off)')
            for am in ams:
                cl.sql('CHECKPOINT')
                bt = cl.timed(INDEX_DDL[am].format(t='trips_' + am))
                cl.sql(f'VACUUM ANALYZE trips_{am}')
                if am == 'amrtree':
                    cl.sql("SELECT amrtree_settle('trips_amrtree_b', 1)")
                size = index_bytes(cl, am, 'trips_' + am)
                leaf = size['pmem'] + size['ssd']
                share = size['pmem'] / leaf if leaf else float('nan')
                r.setdefault('build_s', {})[am] = bt
                r.setdefault('size', {})[am] = size
                res.add(rows=rows, metric='build_time', am=am, value=bt, unit='s')
                res.add(rows=rows, metric='index_bytes', am=am, value=size['total'], unit='bytes',
                        detail='dram=%(dram)d pmem=%(pmem)d ssd=%(ssd)d' % size)
                if am == 'amrtree':
                    r['pmem_share'] = share
                    res.add(rows=rows, metric='pmem_share', am=am, value=share, unit='fraction')
                log('  %-8s build %8.2f s  size %8.1f MB%s'
                    % (AM_LABEL[am], bt, size['total'] / 1048576,
                       '  (DRAM %.1f MB, PMEM %.1f MB, SSD %.1f MB: %.1f %% of leaf bytes on PMEM)'
                       % (size['dram'] / 1048576, size['pmem'] / 1048576, size['ssd'] / 1048576,
                          100 * share) if am == 'amrtree' else ''))
            spread = data_spread(cl)
            windows = make_windows(cl, 'trips_amrtree', rows, spread, sels)
            # the calibrated windows, and issue 14's own small window: a box
            # of +-0.0002 degrees around a data box's centre, whatever it meets
            runs = [('range %s' % pct(s_), windows[s_][0], windows[s_][1]) for s_ in sels]
            runs.append((FIXED_WINDOW_LABEL, FIXED_WINDOW_HALF, FIXED_WINDOW_HALF))
            for label, hw, hh in runs:
                for rnd in range(3):
                    for am in rotated(ams, rnd):
                        q = cl.pgbench([os.path.join(SCRIPTS, 'range.sql')], clients,
                                       seconds=seconds,
                                       defines={'hw': hw, 'hh': hh,
                                                'n': ncenters, 'tbl': 'trips_' + am}, tag='q')
                        r.setdefault('tps', {}).setdefault(label, {}).setdefault(am, []).append(q['tps'])
                per = {am: mean_sd(r['tps'][label][am])[0] for am in ams}
                r['tps'][label] = per
                for am in ams:
                    res.add(rows=rows, metric='tps', script=label, am=am, value=per[am], unit='tps')
                log('  %-12s %s   amrtree/GiST %.2f' % (label, '  '.join(
                    '%s %7.0f' % (SHORT[am], per[am]) for am in ams), ratio(per['amrtree'], per['gist'])))
            x, y = (float(v) for v in cl.rows('SELECT x, y FROM bench_centers WHERE id = 1')[0])
            hw, hh = windows[sels[0]][0], windows[sels[0]][1]
            for am in ams:
                ts = [cl.restart_to_first_query(
                    f"SET enable_seqscan = off;\nSELECT count(*) FROM trips_{am} WHERE b && "
                    f"box(point({x - hw!r}, {y - hh!r}), point({x + hw!r}, {y + hh!r}));")
                    for _ in range(2)]
                total = mean_sd([t[0] + t[1] for t in ts])[0]
                r.setdefault('restart_s', {})[am] = total
                res.add(rows=rows, metric='restart_to_first_query', am=am, value=total, unit='s')
                log('  %-8s restart to first query %.3f s' % (AM_LABEL[am], total))
        finally:
            cl.remove()
    log('\n== growth: ratios to GiST (build speed = GiST time / time; tps = amrtree / GiST)')
    labels = ['range ' + pct(s_) for s_ in sels] + [FIXED_WINDOW_LABEL]
    log('  %10s %12s %12s %12s %12s %14s %12s %10s' % ('rows', 'build', *labels,
                                                       'PMEM share', 'restart s'))
    for rows in sizes:
        r = summary['results'][rows]
        log('  %10d %12.2f %12.2f %12.2f %12.2f %14.2f %11.1f%% %10.3f'
            % (rows, ratio(r['build_s']['gist'], r['build_s']['amrtree']),
               *[ratio(r['tps'][l]['amrtree'], r['tps'][l]['gist']) for l in labels],
               100 * r['pmem_share'], r['restart_s']['amrtree']))
    csvp = res.write_csv()
    with open(os.path.join(outdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1, default=str)
    if len(sizes) > 1:
        plot_growth([csvp], os.path.join(outdir, 'growth-loglog.png'))
    log('\nresults: %s, summary.json in %s; elapsed %.0f s' % (csvp, outdir, time.monotonic() - t0))


def read_growth_csv(paths):
    """growth.csv rows of one or more runs, as {rows: {(metric, script): {am: value}}};
    a size measured in several runs keeps the last run's values."""
    data = {}
    for path in paths:
        with open(path, newline='') as f:
            for r in csv.DictReader(f):
                key = (r['metric'], r.get('script') or '')
                data.setdefault(int(r['rows']), {}).setdefault(key, {})[r['am']] = float(r['value'])
    return data


def plot_growth(paths, outpath):
    """A log-log figure of cost against rows from growth.csv files: build
    time, index size, restart to first query, and the time of one range
    query (seconds per transaction per client) at each window size."""
    plt = plt_or_none()
    if plt is None:
        return None
    data = read_growth_csv(paths)
    sizes = sorted(data)
    ams = ['amrtree', 'gist', 'spgist']
    styles = {'amrtree': 'o-', 'gist': 's--', 'spgist': '^:'}
    scripts = sorted({k[1] for n in sizes for k in data[n] if k[0] == 'tps'},
                     key=lambda l: (l == FIXED_WINDOW_LABEL,
                                    0.0 if l == FIXED_WINDOW_LABEL else float(l.split()[1].rstrip('%'))))
    panels = [('build time (s)', lambda n, am: data[n].get(('build_time', ''), {}).get(am)),
              ('index size (MB)',
               lambda n, am: (data[n].get(('index_bytes', ''), {}).get(am) or 0) / 1048576 or None),
              ('restart to first query (s)',
               lambda n, am: data[n].get(('restart_to_first_query', ''), {}).get(am))]
    for label in scripts:
        panels.append(('range query, %s window: 1000 / tps (ms)' % label.split()[1],
                       lambda n, am, l=label: 1000.0 / data[n][('tps', l)][am]
                       if data[n].get(('tps', l), {}).get(am) else None))
    ncol = 3
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.2 * nrow))
    axes = list(axes.flat) if hasattr(axes, 'flat') else [axes]
    for ax, (title, get) in zip(axes, panels):
        for am in ams:
            pts = [(n, get(n, am)) for n in sizes]
            pts = [(n, v) for n, v in pts if v]
            if pts:
                ax.loglog([p[0] for p in pts], [p[1] for p in pts], styles[am],
                          label=AM_LABEL[am])
        ax.set_title(title, fontsize=10)
        ax.set_xlabel('rows')
        ax.grid(True, which='both', alpha=0.3)
    for ax in axes[len(panels):]:
        ax.axis('off')
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(outpath, dpi=100)
    plt.close(fig)
    log('plot: %s' % outpath)
    return outpath


def cmd_growth_plot(args):
    """The log-log figure from the growth.csv of earlier bench/growth runs
    (one size per run is how the big sizes fit in a session)."""
    plot_growth(args.csv, args.output)


def cmd_budget_sweep(args):
    configs = ['shm', 'disk'] if args.config == 'both' else [args.config]
    for cfg in configs:
        budget_sweep_one(args, cfg, len(configs) > 1)


def budget_sweep_one(args, cfg, several):
    """The sweep in one configuration: shm (emulated PMEM, synchronous_commit
    off) or disk (amrtree's default pool file, synchronous_commit on)."""
    quick = args.quick
    sizes = [int(x) for x in args.rows.split(',')] if args.rows else \
        ([100000] if quick else [100000, 1000000])
    clients_list = [int(x) for x in args.clients.split(',')] if args.clients else \
        ([2] if quick else [1, 2, 4])
    reps = args.reps or (1 if quick else 3)
    qsec = args.seconds or (2 if quick else 10)
    settle = 1 if quick else 2
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    outdir = os.path.join(args.results, 'budget_sweep-' + stamp + ('-' + cfg if several else ''))
    res = Results(outdir, 'budget_sweep')
    info = machine_info()
    print_machine(info, [cfg])
    log('budget sweep (%s): rows %s, clients %s, %d repetition(s), budgets %s%s'
        % (cfg, sizes, clients_list, reps, [c[0] for c in CONFIGS], ' (quick)' if quick else ''))
    extra = ''
    if args.ssd_cache_size is not None:
        extra = "amrtree.ssd_cache_size = '%s'\n" % args.ssd_cache_size
        log('amrtree.ssd_cache_size = %s' % args.ssd_cache_size)
    maxrows = max(sizes)
    pool_mb = max(256, int(maxrows * ENTRY_BYTES * 3 / 1048576) * 2 + 256)
    cl = Cluster(args.workdir, 'sweep', pool_mb, pool_mb, extra_conf=extra,
                 pool_on_shm=(cfg == 'shm'),
                 synchronous_commit='off' if cfg == 'shm' else 'on')
    logdir = os.path.join(cl.dir, 'pgbench-logs')
    summary = {'machine': info, 'config': cfg, 'config_note': CONFIG_NOTE[cfg],
               'sizes': sizes, 'clients': clients_list, 'reps': reps,
               'ssd_cache_size': args.ssd_cache_size or 'default',
               'runs': [], 'latency': {}, 'promotion': {}, 'sensitivity': []}
    ins = os.path.join(SCRIPTS, 'insert_batch.sql')
    try:
        t0 = time.monotonic()
        cl.start()
        os.makedirs(logdir, exist_ok=True)
        csvpath = generate_data(args.workdir, maxrows)
        load_source(cl, csvpath)
        ncenters = make_centers(cl)

        parts = set(args.parts.split(','))
        # -- 1. the paper's sweep: insert one by one, settle, look at the tiers
        if 'inserts' in parts:
            run_insert_sweep(cl, summary, res, sizes, clients_list, reps, settle, ins)

        nrows = maxrows
        if parts & {'latency', 'promotion', 'sensitivity'}:
            cl.sql('CREATE INDEX src_b ON src USING amrtree (b)')
            spread = data_spread(cl)
            win = make_windows(cl, 'src', nrows, spread, [0.0001])[0.0001]
            cl.sql('DROP INDEX src_b')
            qdefs = {'hw': win[0], 'hh': win[1], 'n': ncenters, 'nhot': min(1000, ncenters),
                     'tbl': 'sw'}
        if 'latency' in parts:
            run_latency(cl, summary, res, nrows, qsec, settle, ins, qdefs, logdir)
        if 'promotion' in parts:
            run_promotion(cl, summary, res, nrows, qsec, settle, ins, qdefs, win, logdir)
        if 'sensitivity' in parts:
            run_sensitivity(cl, summary, res, qsec, settle, qdefs, logdir, quick)

        if summary['runs']:
            summarize_sweep(summary, res)
        summary['elapsed_s'] = time.monotonic() - t0
        csvp = res.write_csv()
        with open(os.path.join(outdir, 'summary.json'), 'w') as f:
            json.dump(summary, f, indent=1, default=str)
        plot_sweep(summary, outdir)
        log('\nresults: %s (CSV), summary.json and the figures in %s' % (csvp, outdir))
        log('elapsed: %.0f s' % summary['elapsed_s'])
    finally:
        cl.remove()


def run_insert_sweep(cl, summary, res, sizes, clients_list, reps, settle, ins):
    log('\n== inserts (%d rows per transaction, each through aminsert), then amrtree_settle' % BATCH)
    log('  %-9s %-3s %-11s %-3s %12s %9s %9s %9s %7s %7s %8s'
        % ('rows', 'cl', 'config', 'rep', 'rows/s', 'PMEM MB', 'SSD MB', 'PMEM/bud',
           'promo', 'demo', 'WA'))
    # a discarded warm-up pass, then the configurations in an order that
    # rotates with the repetition, so that no configuration always runs
    # first or last
    sweep_index(cl, 'tiering = off')
    cl.pgbench([ins], 2, transactions=min(sizes) // BATCH // 2, defines={'batch': BATCH})
    for nrows in sizes:
        for rep in range(reps):
            for clients in clients_list:
                order = CONFIGS[rep % len(CONFIGS):] + CONFIGS[:rep % len(CONFIGS)]
                for cname, opts in order:
                    sweep_index(cl, opts)
                    per_client = nrows // BATCH // clients
                    r = cl.pgbench([ins], clients, transactions=per_client,
                                   defines={'batch': BATCH})
                    inserted = per_client * clients * BATCH
                    rate = r['tps'] * BATCH
                    cl.sql(f"SELECT amrtree_settle('sw_b', {settle})")
                    st = tier_state(cl)
                    budget = st['pmem']['budget']
                    ratio = st['pmem']['bytes'] / budget if budget else float('nan')
                    wa = st['bytes_moved'] / (inserted * ENTRY_BYTES)
                    run = {'rows': inserted, 'clients': clients, 'config': cname,
                           'rep': rep + 1, 'rows_per_s': rate,
                           'pmem_bytes': st['pmem']['bytes'], 'ssd_bytes': st['ssd']['bytes'],
                           'dram_bytes': st['dram']['bytes'], 'budget_bytes': budget,
                           'pmem_over_budget': ratio, 'promotions': st['promotions'],
                           'demotions': st['demotions'], 'bytes_moved': st['bytes_moved'],
                           'budget_demotions': st['budget_demotions'],
                           'rule_demotions': st['rule_demotions'],
                           'write_amplification': wa}
                    summary['runs'].append(run)
                    res.add(kind='insert_sweep', **run)
                    log('  %-9d %-3d %-11s %-3d %12.0f %9.1f %9.1f %9s %7d %7d %8.3f'
                        % (inserted, clients, cname, rep + 1, rate,
                           st['pmem']['bytes'] / 1048576, st['ssd']['bytes'] / 1048576,
                           '%.1f%%' % (100 * ratio) if budget else '-',
                           st['promotions'], st['demotions'], wa))
    cl.sql('DROP TABLE IF EXISTS sw')



def run_latency(cl, summary, res, nrows, qsec, settle, ins, qdefs, logdir):
    # -- 2. search latency per budget, uniform and skewed windows
    log('\n== search latency per budget (%d rows, 2 clients, %d s per distribution)'
        % (nrows, qsec))
    log('  %-11s %-8s %9s %8s %8s %8s %9s' % ('config', 'queries', 'tps', 'p50 ms',
                                              'p95 ms', 'p99 ms', 'promoted'))
    for cname, opts in CONFIGS:
        sweep_index(cl, opts)
        cl.pgbench([ins], 2, transactions=nrows // BATCH // 2, defines={'batch': BATCH})
        # the same plan for every configuration: an index-only scan over
        # an all-visible table (autovacuum would otherwise decide)
        cl.sql('VACUUM ANALYZE sw')
        cl.sql(f"SELECT amrtree_settle('sw_b', {settle})")
        for dist in ('uniform', 'skewed'):
            before = tier_state(cl)['promotions']
            script = 'range.sql' if dist == 'uniform' else 'skewed.sql'
            r = cl.pgbench([os.path.join(SCRIPTS, script)], 2, seconds=qsec,
                           defines=qdefs, tag='lat', logdir=logdir)
            promoted = tier_state(cl)['promotions'] - before
            ls = lat_summary(r['lat'])
            summary['latency'].setdefault(cname, {})[dist] = {
                'tps': r['tps'], **ls, 'promotions': promoted,
                'cdf': [quantile(r['lat'], q / 100) for q in range(0, 101)]}
            res.add(kind='latency', config=cname, distribution=dist, tps=r['tps'],
                    p50_ms=ls['p50'], p95_ms=ls['p95'], p99_ms=ls['p99'],
                    promotions_during=promoted)
            log('  %-11s %-8s %9.0f %8.3f %8.3f %8.3f %9d'
                % (cname, dist, r['tps'], ls['p50'], ls['p95'], ls['p99'], promoted))



def run_promotion(cl, summary, res, nrows, qsec, settle, ins, qdefs, win, logdir):
    # -- 3. the effect of promotion: a hot region before and after
    log('\n== promotion: a hot region under a 20% budget, before and after the tier manager acts')
    sweep_index(cl, "pmem_budget = '20%'")
    cl.pgbench([ins], 2, transactions=nrows // BATCH // 2, defines={'batch': BATCH})
    cl.sql('VACUUM ANALYZE sw')
    cl.sql(f"SELECT amrtree_settle('sw_b', {settle})")
    set_guc(cl, 'amrtree.scan_interval', '3600s')
    hot = dict(qdefs, nhot=20)

    def hot_leaves_on_ssd():
        """Distinct leaves under the hot windows that are on SSD."""
        return int(cl.sql(f"""
SELECT count(DISTINCT l.leaf_id) FROM amrtree_leaf_table('sw_b') l, bench_centers c
WHERE c.id <= 20 AND l.tier = 'ssd'
  AND l.mbr && box(point(c.x - {win[0]}, c.y - {win[1]}), point(c.x + {win[0]}, c.y + {win[1]}))"""))

    cold_state = tier_state(cl)
    cl.sql('SELECT pg_stat_reset()')
    before = cl.pgbench([os.path.join(SCRIPTS, 'hot.sql')], 1, seconds=qsec,
                        defines=hot, tag='hot', logdir=logdir)
    hot_leaves_ssd = hot_leaves_on_ssd()
    cl.sql(f"SELECT amrtree_settle('sw_b', {settle})")
    mid_state = tier_state(cl)
    after = cl.pgbench([os.path.join(SCRIPTS, 'hot.sql')], 1, seconds=qsec,
                       defines=hot, tag='hot', logdir=logdir)
    hot_leaves_ssd_after = hot_leaves_on_ssd()
    set_guc(cl, 'amrtree.scan_interval', None)
    b, a = lat_summary(before['lat']), lat_summary(after['lat'])
    summary['promotion'] = {
        'before': {'tps': before['tps'], **b, 'hot_leaf_windows_on_ssd': hot_leaves_ssd},
        'after': {'tps': after['tps'], **a, 'hot_leaf_windows_on_ssd': hot_leaves_ssd_after},
        'promotions': mid_state['promotions'] - cold_state['promotions'],
        'demotions': mid_state['demotions'] - cold_state['demotions']}
    for when, x, ssd in (('before', b, hot_leaves_ssd), ('after', a, hot_leaves_ssd_after)):
        tps = before['tps'] if when == 'before' else after['tps']
        res.add(kind='promotion', when=when, tps=tps, p50_ms=x['p50'], p95_ms=x['p95'],
                p99_ms=x['p99'], hot_leaves_on_ssd=ssd)
        log('  %-7s tps %8.0f   p50 %.3f ms  p95 %.3f ms  p99 %.3f ms   hot-region leaves on SSD: %d'
            % (when, tps, x['p50'], x['p95'], x['p99'], ssd))
    log('  the settle in between made %d promotions and %d demotions'
        % (summary['promotion']['promotions'], summary['promotion']['demotions']))



def run_sensitivity(cl, summary, res, qsec, settle, qdefs, logdir, quick):
    # -- 4. sensitivity to theta_up, theta_down and lambda (unlimited budget, skewed queries).
    # Rule R5 demotes only while the pool is above amrtree.pmem_high_watermark;
    # with both watermarks at 0 it demotes every cold leaf, as in the paper, so
    # that theta_down and lambda have something to decide.
    log('\n== sensitivity (unlimited budget, watermarks 0: the hot/cold rules R4/R5 alone decide; '
        'skewed queries, %d s)' % qsec)
    set_guc(cl, 'amrtree.pmem_high_watermark', 0)
    set_guc(cl, 'amrtree.pmem_low_watermark', 0)
    grid = [('defaults', None, None)]
    for name, vals in (('amrtree.promote_threshold', [2, 8]),
                       ('amrtree.demote_threshold', [0.1, 2]),
                       ('amrtree.decay_lambda', [0.02, 0.5])):
        for v in (vals[:1] if quick else vals):
            grid.append(('%s=%g' % (name.split('.')[1], v), name, v))
    log('  %-24s %7s %7s %9s %9s %8s' % ('setting', 'promo', 'demo', 'PMEM %', 'tps', 'p95 ms'))
    for label, name, value in grid:
        if name:
            set_guc(cl, name, value)
        cl.sql("DROP TABLE IF EXISTS sw; CREATE TABLE sw AS SELECT * FROM src; "
               "CREATE INDEX sw_b ON sw USING amrtree (b); VACUUM ANALYZE sw")
        s0 = tier_state(cl)
        r = cl.pgbench([os.path.join(SCRIPTS, 'skewed.sql')], 2, seconds=qsec,
                       defines=qdefs, tag='sens', logdir=logdir)
        cl.sql(f"SELECT amrtree_settle('sw_b', {settle})")
        s1 = tier_state(cl)
        leaf_bytes = s1['pmem']['bytes'] + s1['ssd']['bytes']
        pm = 100 * s1['pmem']['bytes'] / leaf_bytes if leaf_bytes else float('nan')
        ls = lat_summary(r['lat'])
        row = {'setting': label, 'promotions': s1['promotions'] - s0['promotions'],
               'demotions': s1['demotions'] - s0['demotions'], 'pmem_pct': pm,
               'tps': r['tps'], 'p95_ms': ls['p95']}
        summary['sensitivity'].append(row)
        res.add(kind='sensitivity', **row)
        log('  %-24s %7d %7d %8.1f%% %9.0f %8.3f'
            % (label, row['promotions'], row['demotions'], pm, r['tps'], ls['p95']))
        if name:
            set_guc(cl, name, None)
    set_guc(cl, 'amrtree.pmem_high_watermark', None)
    set_guc(cl, 'amrtree.pmem_low_watermark', None)



def summarize_sweep(summary, res):
    log('\n== summary: mean +- sd over repetitions')
    log('  %-9s %-3s %-11s %18s %14s %16s %9s %9s'
        % ('rows', 'cl', 'config', 'rows/s', 'vs off', 'PMEM/budget', 'promo', 'demo'))
    agg = {}
    for r in summary['runs']:
        agg.setdefault((r['rows'], r['clients'], r['config']), []).append(r)
    summary['aggregate'] = []
    for (nrows, clients, cname), rs in agg.items():
        rate, rate_sd = mean_sd([r['rows_per_s'] for r in rs])
        off = agg.get((nrows, clients, 'tiering off'))
        # the overhead is taken per repetition (runs of one repetition are
        # adjacent in time), then averaged
        rel = []
        if off:
            for r in rs:
                o = [x for x in off if x['rep'] == r['rep']]
                if o:
                    rel.append(r['rows_per_s'] / o[0]['rows_per_s'])
        rel_m, rel_sd = mean_sd(rel)
        ratio, ratio_sd = mean_sd([r['pmem_over_budget'] for r in rs])
        pro, _ = mean_sd([r['promotions'] for r in rs])
        dem, _ = mean_sd([r['demotions'] for r in rs])
        a = {'rows': nrows, 'clients': clients, 'config': cname, 'rows_per_s': rate,
             'rows_per_s_sd': rate_sd, 'vs_tiering_off': rel_m, 'vs_tiering_off_sd': rel_sd,
             'pmem_over_budget': ratio, 'pmem_over_budget_sd': ratio_sd,
             'promotions': pro, 'demotions': dem,
             'pmem_bytes': statistics.fmean([r['pmem_bytes'] for r in rs]),
             'ssd_bytes': statistics.fmean([r['ssd_bytes'] for r in rs]),
             'budget_bytes': rs[0]['budget_bytes'],
             'write_amplification': statistics.fmean([r['write_amplification'] for r in rs])}
        summary['aggregate'].append(a)
        res.add(kind='aggregate', **a)
        log('  %-9d %-3d %-11s %10.0f +- %5.0f %6.1f%% +- %4.1f %16s %9.0f %9.0f'
            % (nrows, clients, cname, rate, rate_sd, 100 * rel_m, 100 * rel_sd,
               '%.1f%% +- %.1f' % (100 * ratio, 100 * ratio_sd) if ratio == ratio else '-',
               pro, dem))
    # tiering cost: every budgeted configuration against tiering off
    costs = [1 - a['vs_tiering_off'] for a in summary['aggregate']
             if a['config'] != 'tiering off' and a['vs_tiering_off'] == a['vs_tiering_off']]
    if costs:
        m, sd = mean_sd(costs)
        summary['tiering_cost'] = {'mean': m, 'sd': sd, 'max': max(costs)}
        log('  insert throughput lost to tiering (all budgets, sizes, clients; negative = faster '
            'than tiering off): mean %.1f%% +- %.1f, worst %.1f%%  (target <= 2%%)'
            % (100 * m, 100 * sd, 100 * max(costs)))
    within = [a['pmem_over_budget'] for a in summary['aggregate']
              if a['pmem_over_budget'] == a['pmem_over_budget']]
    if within:
        log('  PMEM / budget after settle: %.1f%% .. %.1f%%  (target 90 .. 102%%)'
            % (100 * min(within), 100 * max(within)))


def plot_sweep(summary, outdir):
    plt = plt_or_none()
    if not plt:
        return
    cnames = [c[0] for c in CONFIGS]
    if summary.get('aggregate'):
        plot_sweep_inserts(plt, summary, outdir, cnames)
    plot_latency_cdfs(plt, summary, outdir, cnames)


def plot_sweep_inserts(plt, summary, outdir, cnames):
    nrows = max(summary['sizes'])
    cl0 = summary['clients'][0]
    agg = {(a['rows'], a['clients'], a['config']): a for a in summary['aggregate']}

    def pick(cname, rows=nrows, clients=cl0):
        for (r, c, n), a in agg.items():
            if n == cname and c == clients and abs(r - rows) <= rows * 0.01:
                return a
        return None

    # Fig. 3: tier bytes per budget, stacked
    fig, ax = plt.subplots(figsize=(7, 4))
    pm = [(pick(c) or {}).get('pmem_bytes', 0) / 1048576 for c in cnames]
    ss = [(pick(c) or {}).get('ssd_bytes', 0) / 1048576 for c in cnames]
    ax.bar(cnames, pm, label='PMEM', color='#1f77b4')
    ax.bar(cnames, ss, bottom=pm, label='SSD', color='#bbbbbb')
    for i, c in enumerate(cnames):
        a = pick(c)
        if a and a['budget_bytes']:
            ax.hlines(a['budget_bytes'] / 1048576, i - 0.4, i + 0.4, colors='red',
                      linestyles='dashed', label='budget' if i == 0 else None)
    ax.set_ylabel('MB of leaves')
    ax.set_title('Leaf bytes per tier after amrtree_settle (%d rows)' % nrows)
    save_figure(plt, fig, ax, outdir, 'fig3-tier-bytes.png')

    # Fig. 4: promotions and demotions
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(cnames))
    ax.bar([i - 0.2 for i in x], [(pick(c) or {}).get('promotions', 0) for c in cnames], 0.4,
           label='promotions')
    ax.bar([i + 0.2 for i in x], [(pick(c) or {}).get('demotions', 0) for c in cnames], 0.4,
           label='demotions')
    ax.set_xticks(list(x))
    ax.set_xticklabels(cnames)
    ax.set_ylabel('leaves moved')
    ax.set_title('Migrations during insertion and settle (%d rows)' % nrows)
    save_figure(plt, fig, ax, outdir, 'fig4-migrations.png')

    # Fig. 5: insert throughput per budget, per client count
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(summary['clients']))
    for j, c in enumerate(summary['clients']):
        vals = [(pick(n, clients=c) or {}).get('rows_per_s', 0) for n in cnames]
        errs = [(pick(n, clients=c) or {}).get('rows_per_s_sd', 0) for n in cnames]
        ax.bar([i + (j - (len(summary['clients']) - 1) / 2) * width for i in x], vals, width,
               yerr=errs, label='%d client(s)' % c)
    ax.set_xticks(list(x))
    ax.set_xticklabels(cnames)
    ax.set_ylabel('rows inserted / s')
    ax.set_title('Insert throughput (%d rows, mean +- sd)' % nrows)
    save_figure(plt, fig, ax, outdir, 'fig5-insert-throughput.png')



def plot_latency_cdfs(plt, summary, outdir, cnames):
    if not summary['latency']:
        return                  # the latency part did not run
    for dist in ('uniform', 'skewed'):
        fig, ax = plt.subplots(figsize=(7, 4))
        for c in cnames:
            l = summary['latency'].get(c, {}).get(dist)
            if l:
                ax.plot(l['cdf'], [q / 100 for q in range(0, 101)], label=c)
        ax.set_xscale('log')
        ax.set_xlabel('latency (ms)')
        ax.set_ylabel('fraction of queries')
        ax.set_title('Query latency CDF, %s windows (0.01%%)' % dist)
        save_figure(plt, fig, ax, outdir, 'latency-cdf-%s.png' % dist)


# ---------------------------------------------------------------- main

def driver_parser(doc):
    """The command line every driver takes (--workdir, --results, then a
    command: add its parser to the returned subparsers), with Ctrl-C and
    termination turned into Interrupted so that the throwaway clusters are
    removed."""
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--workdir', required=True, help='throwaway clusters and data go here')
    p.add_argument('--results', default=os.path.join(ROOT, 'bench', 'results'))
    return p, p.add_subparsers(dest='cmd', required=True)


def run_command(fn, args):
    """fn(args); an interruption ends the process with status 130 once the
    clusters are gone (the drivers remove them in their finally blocks)."""
    try:
        fn(args)
    except Interrupted as e:
        log('\ninterrupted (%s): the throwaway clusters were stopped and removed' % e)
        sys.exit(130)


def main():
    p, sub = driver_parser(__doc__)
    c = sub.add_parser('compare')
    c.add_argument('--quick', action='store_true')
    c.add_argument('--rows', type=int)
    c.add_argument('--bulk-rows', type=int)
    c.add_argument('--clients', type=int, default=2)
    c.add_argument('--seconds', type=int)
    c.add_argument('--reps', type=int)
    c.add_argument('--data', choices=['porto', 'coast'], default='porto',
                   help='porto: synthetic Porto-like taxi boxes; coast: GSHHG coastline '
                   'segments (--data-file)')
    c.add_argument('--data-file', help='--data coast: the CSV that bench/coast_gen.py wrote')
    c.add_argument('--config', choices=['shm', 'disk', 'both'], default='shm',
                   help='shm: the pool on /dev/shm, synchronous_commit off; disk: the default '
                   'pool file in the data directory, synchronous_commit on; both: side by side')
    g = sub.add_parser('growth')
    g.add_argument('--rows', help='comma-separated sizes (default 1000000,10000000)')
    g.add_argument('--clients', type=int, default=2)
    g.add_argument('--seconds', type=int, help='seconds per pgbench run (default 5)')
    g.add_argument('--maintenance-work-mem',
                   help="maintenance_work_mem for every build (default 1GB, as in the other "
                   "benchmarks; PostgreSQL's own default is 64MB)")
    gp = sub.add_parser('growth_plot')
    gp.add_argument('csv', nargs='+', help='growth.csv files of bench/growth runs')
    gp.add_argument('--output', default=os.path.join(ROOT, 'docs', 'evaluation', 'growth-loglog.png'))
    s = sub.add_parser('budget_sweep')
    s.add_argument('--quick', action='store_true')
    s.add_argument('--config', choices=['shm', 'disk', 'both'], default='shm',
                   help='shm: the pool on /dev/shm, synchronous_commit off; disk: the default '
                   'pool file in the data directory, synchronous_commit on; both: one after '
                   'the other')
    s.add_argument('--rows', help='comma-separated sizes')
    s.add_argument('--clients', help='comma-separated client counts')
    s.add_argument('--reps', type=int)
    s.add_argument('--seconds', type=int, help='seconds per query run')
    s.add_argument('--parts', default='inserts,latency,promotion,sensitivity',
                   help='comma-separated subset of inserts,latency,promotion,sensitivity')
    s.add_argument('--ssd-cache-size', help="amrtree.ssd_cache_size for the run (e.g. '0' "
                   "to measure the SSD tier without its DRAM cache); default: the GUC's default")
    args = p.parse_args()
    run_command({'compare': cmd_compare, 'growth': cmd_growth, 'growth_plot': cmd_growth_plot,
                 'budget_sweep': cmd_budget_sweep}[args.cmd], args)


if __name__ == '__main__':
    main()
