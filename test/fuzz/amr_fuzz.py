#!/usr/bin/env python3
"""Randomized differential fuzzer for amrtree.

Starts a primary (shared_preload_libraries = amrtree) and a hot standby
streaming from it, runs writer, DDL and checker workers against them, and
compares every index answer with a sequential scan in the same snapshot.
See test/fuzz/README.md.  Only the Python standard library and psql are
needed: each worker keeps one psql process open and talks to it through a
pipe.
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback

# --------------------------------------------------------------------------
# configurations

CONFIGS = {
    # the default write-back pool on a disk file, with an SSD tier
    'disk': dict(pool='disk', pmem_size='64MB', ssd_size='64MB',
                 budget='30%', extra={}),
    # emulated PMEM on /dev/shm, a tiny budget and watermarks at zero: the
    # tier manager moves leaves between PMEM and SSD all the time
    'shm-tiny': dict(pool='shm', pmem_size='32MB', ssd_size='128MB',
                     budget='5%', extra={
                         'amrtree.scan_interval': '100ms',
                         'amrtree.pmem_high_watermark': '0',
                         'amrtree.pmem_low_watermark': '0',
                         'amrtree.demote_threshold': '3',
                         'amrtree.promote_threshold': '4',
                         'amrtree.ssd_cache_size': '1MB',
                         'amrtree.dram_leaf_cache': '64kB',
                     }),
    # disk pool, no SSD tier, small pool and DRAM (64MB: the workload filled
    # 32MB after about four minutes, and most writes failed from then on;
    # twice that lets a run see more writes before "pool is full")
    'disk-nossd': dict(pool='disk', pmem_size='64MB', ssd_size='0',
                       budget='unlimited', extra={
                           'amrtree.dram_size': '1MB',
                           'amrtree.writeback_delay': '20ms',
                       }),
    # /dev/shm pool, SSD tier with the cache off, budgets in bytes
    'shm-ssd': dict(pool='shm', pmem_size='48MB', ssd_size='96MB',
                    budget='64kB', extra={
                        'amrtree.scan_interval': '200ms',
                        'amrtree.ssd_cache_size': '0',
                        'amrtree.io_method': 'sync',
                    }),
}

# Errors that the workload can cause and that are not bugs.  Anything else
# an ERROR/FATAL/PANIC line says is counted as unexpected.
EXPECTED_ERRORS = [
    r'deadlock detected',
    r'canceling statement due to (statement timeout|lock timeout|user request)',
    r'canceling statement due to conflict with recovery',
    r'terminating connection due to conflict with recovery',
    r'terminating connection because of crash of another server process',
    r'terminating connection due to administrator command',
    r'server closed the connection unexpectedly',
    r'the database system is (in recovery mode|starting up|shutting down|not yet accepting connections|not accepting connections)',
    r'connection to server .* failed',
    r'could not connect to server',
    r'no connection to the server',
    r'connection to server was lost',
    r'current transaction is aborted',
    r'could not serialize access',
    r'cannot execute .* in a read-only transaction',
    r'prepared transaction with identifier .* does not exist',
    r'prepared transaction with identifier .* is busy',
    r'transaction identifier .* is already in use',
    # documented: PREPARE TRANSACTION after CREATE/DROP of an amrtree index
    r'cannot PREPARE a transaction that (creates|drops|created|dropped)',
    r'cannot prepare a transaction that',
    r'relation .* does not exist',
    r'index .* does not exist',
    r'already exists',
    r'could not obtain lock',
    r'lock timeout',
    r'amrtree_settle.* (is refused|cannot run) .*standby',
    r'cannot .* during recovery',
    r'recovery is in progress',
    r'out of (PMEM|SSD) (slots|space)',
    r'amrtree (DRAM area|PMEM pool|SSD slot file|Leaf Table) is full',
    r'unexpected postmaster exit',
    r'savepoint .* does not exist',
    r'cannot reindex .* concurrently',  # e.g. invalid toast
    r'SSL SYSCALL',
    r'EOF detected',
    r'was terminated by signal 9',
    r'no tree in the PMEM pool',       # standby functions before replay
    r'cannot be used until WAL replay',
    r'is being rebuilt',
]
EXPECTED_RE = re.compile('|'.join(EXPECTED_ERRORS), re.I)
# ... and on the standby only: a query planned on a table while replay drops
# one of its indexes (the end of REINDEX / DROP INDEX CONCURRENTLY) fails
# in PostgreSQL's planner, whatever the index type (docs/user-guide.md,
# Limits: "concurrent builds and old snapshots on a hot standby")
STANDBY_EXPECTED_RE = re.compile(r'could not open relation with OID', re.I)


def is_expected(text, standby):
    """Is an error (or log line) one the workload causes, on the standby if
    standby?"""
    return bool(EXPECTED_RE.search(text) or (standby and STANDBY_EXPECTED_RE.search(text)))
ERR_LINE_RE = re.compile(r'(?:^|: )(ERROR|FATAL|PANIC):\s+(.*)')

# Server log lines that are always bugs, unless a kill of ours explains them.
LOG_BAD_RE = re.compile(r'PANIC|TRAP:|Assert|could not|unexpected|corrupt|'
                        r'damaged|wrong order|invalid page|leak', re.I)
LOG_OK_RE = re.compile(
    r'could not (receive data from client|send data to client|connect to the primary|'
    r'receive data from WAL stream|start WAL streaming|serialize access|obtain lock|fork)|'
    r'unexpected EOF on client connection|unexpected EOF|'
    r'terminating connection|was terminated by signal 9|'
    r'server process .* was terminated|'
    r'database system was not properly shut down|'
    r'deadlock detected|canceling statement|'
    r'could not open file .*amrtree_fault|'
    r'could not (read|write) (to|from) (the )?(log|client)|'
    r'last completed transaction was at|'
    r'connection to server .* closed unexpectedly|'
    r'could not access status of transaction|unexpected pageaddr|invalid record length|record with incorrect prev-link|contrecord', re.I)


# amrtree.fault_injection crash points (docs/user-guide.md, "Testing crash
# safety") that crash a backend or worker of the primary; redo:* and
# reconcile:after_release stop the server instead and are left out
FAULT_POINTS = [
    'append:after_logged', 'append:before_entry', 'append:after_entry_persisted',
    'append:after_count_persisted', 'append:reuse_after_entry_persisted',
    'append:reuse_after_flag_persisted', 'first_leaf:before_image',
    'first_leaf:after_image_persisted', 'first_leaf:after_publish',
    'rewrite:before_image', 'rewrite:after_image_persisted', 'rewrite:after_switch',
    'split:before_images', 'split:after_right_persisted', 'split:after_new_leaf_persisted',
    'split:after_logged', 'split:after_publish', 'split:after_switch',
    'switch:after_logged', 'switch:count_written', 'vacuum:before_image',
    'vacuum:after_image_persisted', 'vacuum:after_switch', 'vacuum:before_mark_dead',
    'vacuum:before_marks_stored', 'vacuum:after_mark_dead', 'vacuum:free_logged',
    'vacuum:leaves_freed', 'promote:before_copy',
    'promote:after_copy_persisted', 'promote:after_switch', 'demote:before_copy',
    'demote:after_copy_persisted', 'demote:after_switch', 'build:after_tree_created',
    'build:before_leaf', 'build:after_leaf_persisted', 'build:after_leaf_published',
    'build:after_metapage', 'commit:before_apply', 'create:before_valid',
    'drop:after_dropped_state', 'drop:after_leaf_released', 'drop:before_free_state',
    'reconcile:after_prune_horizon', 'reconcile:after_prune', 'reconcile:after_prune_rewrite',
]


# invalid indexes that crashed concurrent builds left behind (REINDEX TABLE
# CONCURRENTLY would rebuild them too, and they fill the pool)
DROP_INVALID = ("DO $$DECLARE r record; BEGIN FOR r IN SELECT indexrelid::regclass AS i FROM pg_index "
                "WHERE NOT indisvalid AND indrelid IN ('f1'::regclass, 'f2'::regclass, 'f3'::regclass) LOOP "
                "EXECUTE 'DROP INDEX ' || r.i; END LOOP; END$$;")


class Lost(Exception):
    pass


def now():
    return time.monotonic()


# --------------------------------------------------------------------------
# psql session over a pipe

class Sess:
    """One psql process.  run() sends SQL followed by an \\echo marker and
    returns (rows, errors): rows are the '|'-separated output lines, errors
    the ERROR/FATAL texts.  Raises Lost when psql exited (connection lost)."""

    def __init__(self, fz, port, name, setup=''):
        self.fz = fz
        self.port = port
        self.name = name
        self.n = 0
        self.p = None
        self.setup = setup

    def open(self):
        self.close()
        env = dict(os.environ, PGCONNECT_TIMEOUT='5', PGAPPNAME='fz-' + self.name)
        self.p = subprocess.Popen(
            ['stdbuf', '-o0', '-e0', self.fz.bin('psql'), '-X', '-q', '-A', '-t',
             '-F', '|', '-v', 'ON_ERROR_STOP=0', '-h', '127.0.0.1',
             '-p', str(self.port), '-U', 'postgres', '-d', 'fuzz'],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
        rows, errs = self.run("SET client_min_messages = warning;"
                              "SET statement_timeout = '60s';"
                              "SET lock_timeout = '20s';" + self.setup)
        if errs:
            raise Lost('setup failed: %s' % errs)

    def close(self):
        if self.p:
            try:
                self.p.stdin.close()
            except Exception:
                pass
            try:
                self.p.kill()
            except Exception:
                pass
            try:
                self.p.wait(5)
            except Exception:
                pass
            self.p = None

    def run(self, sql):
        if self.p is None:
            self.open()
        self.n += 1
        mark = '__FZ_END_%d__' % self.n
        try:
            self.p.stdin.write(sql + '\n\\echo ' + mark + '\n')
            self.p.stdin.flush()
        except (BrokenPipeError, OSError):
            self.p = None
            raise Lost('pipe closed')
        rows, errs = [], []
        while True:
            line = self.p.stdout.readline()
            if line == '':
                self.p = None
                raise Lost('psql exited: ' + '; '.join(errs[-3:]))
            line = line.rstrip('\n')
            if line == mark:
                break
            m = ERR_LINE_RE.search(line)
            if m and line.startswith(('psql:', 'ERROR', 'FATAL', 'PANIC')):
                errs.append(m.group(1) + ': ' + m.group(2))
            elif line.startswith('psql:') or line.startswith(('WARNING', 'DETAIL', 'HINT', 'CONTEXT', 'LINE', 'NOTICE')) or 'connection to server' in line or 'server closed' in line or 'This probably means' in line or 'before or while processing' in line:
                if 'connection' in line or 'closed' in line:
                    errs.append('FATAL: ' + line)
                continue
            else:
                rows.append(line)
        return rows, errs


# --------------------------------------------------------------------------
# random values

class Gen:
    def __init__(self, rnd):
        self.r = rnd
        self.dups = [self.coord_pair() for _ in range(20)]

    def f(self):
        r = self.r
        x = r.random()
        if x < 0.80:
            return round(r.uniform(0, 1000), r.choice([0, 1, 3, 6, 12]))
        if x < 0.86:
            return r.uniform(-1, 1) * 10 ** r.randint(-300, -5)
        if x < 0.92:
            # huge, but products of two stay finite: the geometric operators
            # raise "value out of range: overflow" on both plans beyond that
            return r.uniform(-1, 1) * 10 ** r.randint(10, 150)
        if x < 0.95:
            return r.choice([0.0, -0.0, 1e-6, 1000.0, 500.0])
        if x < 0.975:
            return r.choice([float('inf'), float('-inf')])
        return float('nan')

    def coord_pair(self):
        return (round(self.r.uniform(0, 1000), 2), round(self.r.uniform(0, 1000), 2))

    @staticmethod
    def fs(v):
        if math.isnan(v):
            return 'NaN'
        if math.isinf(v):
            return 'Infinity' if v > 0 else '-Infinity'
        return repr(v)

    def pt(self, near=None):
        r = self.r
        if near is None and r.random() < 0.1:
            near = r.choice(self.dups)
        if near is not None:
            if r.random() < 0.5:
                return near
            return (near[0] + r.uniform(-5, 5), near[1] + r.uniform(-5, 5))
        if r.random() < 0.85:
            return (r.uniform(0, 1000), r.uniform(0, 1000))
        return (self.f(), self.f())

    def point(self):
        x, y = self.pt()
        return "point(%s)" % self.plit(x, y)

    def plit(self, x, y):
        return "'%s'::float8, '%s'::float8" % (self.fs(x), self.fs(y))

    def ptxt(self, x, y):
        return '(%s,%s)' % (self.fs(x), self.fs(y))

    def size(self):
        r = self.r.random()
        if r < 0.15:
            return 0.0                      # degenerate
        if r < 0.75:
            return self.r.uniform(0, 10)
        if r < 0.95:
            return self.r.uniform(0, 200)
        return self.r.choice([1e-9, 1e6, 1e100, float('inf')])

    def box_txt(self):
        x, y = self.pt()
        w = self.size()
        h = 0.0 if self.r.random() < 0.1 else self.size()
        return '(%s,%s)' % (self.ptxt(x, y), self.ptxt(x + w, y + h))

    def box(self):
        return "'%s'::box" % self.box_txt()

    def poly(self):
        x, y = self.pt()
        n = self.r.randint(1, 6)
        s = self.size() or 1.0
        pts = []
        for i in range(n):
            a = 2 * math.pi * i / n + self.r.uniform(0, 0.5)
            pts.append(self.ptxt(x + s * math.cos(a) if not math.isinf(x) else x,
                                 y + s * math.sin(a) if not math.isinf(y) else y))
        return "'(%s)'::polygon" % ','.join(pts)

    def circle(self):
        x, y = self.pt()
        rad = self.size()
        if self.r.random() < 0.01:
            rad = float('nan')
        return "'<%s,%s>'::circle" % (self.ptxt(x, y), self.fs(rad))

    def geom(self, member=False):
        """A PostGIS geometry (SRID 0): a point, line, envelope or polygon,
        sometimes empty or a collection; coordinates as pt() gives them,
        but no NaN in a collection's members: PostGIS's box of such a
        collection leaves out the member's whole extent on that axis (its
        box merge drops NaN), so no box bounds its "<->", and GiST and
        amrtree alike return it late (docs/user-guide.md, PostGIS)."""
        r = self.r.random()
        if r < 0.04:
            return "'%s EMPTY'::geometry" % self.r.choice(['POINT', 'POLYGON', 'GEOMETRYCOLLECTION'])
        x, y = self.pt()
        if member:
            x, y = (500.0 if math.isnan(x) else x), (500.0 if math.isnan(y) else y)
        if r < 0.45:
            return 'ST_MakePoint(%s)' % self.plit(x, y)
        if r < 0.65:
            x2, y2 = self.pt(near=(x, y))
            if member and (math.isnan(x2) or math.isnan(y2)):
                x2, y2 = x, y
            return 'ST_MakeLine(ST_MakePoint(%s), ST_MakePoint(%s))' % (self.plit(x, y), self.plit(x2, y2))
        # a ring whose first point has a NaN or infinite coordinate is never
        # closed to PostGIS (it compares |a - b| with a tolerance), and its
        # functions raise on it, with or without an index
        x, y = (x if math.isfinite(x) else 500.0), (y if math.isfinite(y) else 500.0)
        if r < 0.85:
            return 'ST_MakeEnvelope(%s, %s)' % (self.plit(x, y), self.plit(x + self.size(), y + self.size()))
        if r < 0.95:
            return 'ST_MakePolygon(ST_MakeLine(ARRAY[%s]))' % ','.join(
                'ST_MakePoint(%s)' % self.plit(a, b) for a, b in
                ((x, y), (x + self.size(), y), (x, y + self.size()), (x, y)))
        return 'ST_Collect(%s, %s)' % (self.geom(member=True), self.geom(member=True))

    def val(self, kind, nullp=0.05):
        if self.r.random() < nullp:
            return 'NULL'
        return {'box': self.box, 'point': self.point, 'polygon': self.poly,
                'circle': self.circle, 'geometry': self.geom}[kind]()

    def row(self):
        return '(%s, %d)' % (', '.join(self.val(k) for k in KIND.values()), self.r.randint(0, 99))


# the indexed columns and their types (--postgis adds gm, a PostGIS
# geometry indexed with amrtree_postgis's geometry_ops_2d)
KIND = {'b': 'box', 'p': 'point', 'pg': 'polygon', 'c': 'circle'}

# operators per indexed column: (operator, right argument kind)
OPS = {
    'b': [(o, 'box') for o in ['<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@',
                               '&<|', '<<|', '|>>', '|&>']],
    'p': [(o, 'point') for o in ['<<', '>>', '~=', '<<|', '|>>', '<^', '>^']]
    + [('<@', 'box'), ('<@', 'polygon'), ('<@', 'circle')],
    'pg': [(o, 'polygon') for o in ['<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@',
                                    '&<|', '<<|', '|>>', '|&>']],
    'c': [(o, 'circle') for o in ['<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@',
                                  '&<|', '<<|', '|>>', '|&>']],
}
IOS_COLS = ('b', 'p')           # index-only scans: box_ops and point_ops


def row_cols():
    """The columns of an inserted row, in Gen.row()'s order."""
    return ', '.join(list(KIND) + ['v'])


def cols(sql):
    """sql with the row columns of an INSERT, written (b, p, pg, c, v), as
    the tables have them (with gm under --postgis)."""
    return sql.replace('(b, p, pg, c, v)', '(%s)' % row_cols())


def table_cols():
    """The indexed columns of a table, as CREATE TABLE lists them."""
    return ', '.join('%s %s' % (c, k) for c, k in KIND.items())


def enable_postgis():
    """Add the geometry column gm to every table, its operators and values."""
    KIND['gm'] = 'geometry'
    OPS['gm'] = [(o, 'geometry') for o in ['<<', '&<', '&&', '&>', '>>', '~=', '~', '@',
                                           '&<|', '<<|', '|>>', '|&>']]
# f2's indexes are partial; f3 is unlogged (emptied by a crash, with its
# indexes; not readable on the standby)
TABLES = {'f1': '', 'f2': ' AND v % 2 = 0', 'f3': ''}

PLAN = {
    'index': 'SET LOCAL enable_seqscan=off; SET LOCAL enable_bitmapscan=off; SET LOCAL enable_indexonlyscan=off; SET LOCAL enable_indexscan=on;',
    'ios': 'SET LOCAL enable_seqscan=off; SET LOCAL enable_bitmapscan=off; SET LOCAL enable_indexonlyscan=on; SET LOCAL enable_indexscan=on;',
    'bitmap': 'SET LOCAL enable_seqscan=off; SET LOCAL enable_bitmapscan=on; SET LOCAL enable_indexscan=off; SET LOCAL enable_indexonlyscan=off;',
    'seq': 'SET LOCAL enable_seqscan=on; SET LOCAL enable_bitmapscan=off; SET LOCAL enable_indexscan=off; SET LOCAL enable_indexonlyscan=off;',
}


# --------------------------------------------------------------------------
# the fuzzer

class Fuzz:
    def __init__(self, a):
        self.a = a
        self.seed = a.seed
        self.cfg = CONFIGS[a.config]
        self.dir = os.path.abspath(a.dir)
        self.pdir = os.path.join(self.dir, 'primary')
        self.sdir = os.path.join(self.dir, 'standby')
        self.pport = a.port
        self.sport = a.port + 1
        self.lock = threading.Lock()
        self.stats = dict(queries=0, comparisons=0, mismatches=0, standby_doc_limit=0,
                          crashes_injected=0, backend_kills=0, primary_kills=0,
                          standby_kills=0, unexpected_errors=0, expected_errors=0,
                          ddl=0, writes=0, checks_failed=0, lost_connections=0,
                          plans_amrtree=0, plans_other=0, faults_fired=0, orphans_ended=0,
                          top_ups=0, final_rows_f1=0)
        self.stop = threading.Event()
        self.failures = []
        self.paused = threading.Event()    # set while servers restart
        self.paused.set()
        self.primary_down = threading.Event()
        self.standby_down = threading.Event()
        self.rebuilds = []                 # (start, end) of concurrent rebuilds on primary
        self.kills = []                    # times of our kills (for log triage)
        self.maxid = 0
        self.orphans = set()               # gids of prepared xacts whose writer lost its session
        self.tag = 'h%dfz%d' % (os.getpid() % 1000, self.seed)
        self.ppool = None
        self.spool = None
        self.logf = open(os.path.join(self.dir, 'fuzz.log'), 'a') if os.path.isdir(self.dir) else None
        self.names = {}

    # ---------------- helpers
    def bin(self, name):
        return os.path.join(self.a.pgbin, name)

    def log(self, msg):
        line = '%s [seed %d] %s' % (time.strftime('%H:%M:%S'), self.seed, msg)
        with self.lock:
            if self.logf:
                self.logf.write(line + '\n')
                self.logf.flush()
            if self.a.verbose:
                print(line, flush=True)

    def bump(self, k, n=1):
        with self.lock:
            self.stats[k] += n

    def fail(self, kind, detail):
        with self.lock:
            self.failures.append(dict(kind=kind, detail=detail, time=time.strftime('%H:%M:%S')))
            if kind == 'mismatch':
                self.stats['mismatches'] += 1
            elif kind == 'check':
                self.stats['checks_failed'] += 1
            else:
                self.stats['unexpected_errors'] += 1
        self.log('FAILURE %s: %s' % (kind, json.dumps(detail)[:2000]))

    def errs(self, errs, where, sql, failed_at=None, standby=False):
        """Classify errors; unexpected ones are failures (failed_at: the
        statement of a checker batch that raised it).  Returns those."""
        unexpected = []
        for e in errs:
            if is_expected(e, standby):
                self.bump('expected_errors')
            else:
                detail = dict(where=where, error=e)
                if failed_at:
                    detail['failed_at'] = failed_at
                detail['sql'] = sql[:4000]
                self.fail('error', detail)
                unexpected.append(e)
        return unexpected

    def as_pg(self, args, **kw):
        return subprocess.run(['runuser', '-u', 'postgres', '--'] + args, **kw)

    # ---------------- servers
    def conf_common(self, port):
        c = {
            'port': str(port),
            'listen_addresses': "'127.0.0.1'",
            'unix_socket_directories': "'%s'" % self.dir,
            'shared_preload_libraries': "'amrtree'",
            'max_connections': '40',
            'max_prepared_transactions': '10',
            'max_wal_senders': '5',
            # the standby reconnects 5 s after a primary crash: keep the
            # WAL it has not received, or the primary may recycle it first
            # ("requested WAL segment ... has already been removed")
            'wal_keep_size': "'1GB'",
            'wal_level': 'replica',
            'hot_standby': 'on',
            'hot_standby_feedback': 'on',
            'max_standby_streaming_delay': '10s',
            'shared_buffers': '32MB',
            'fsync': 'on',
            'autovacuum_naptime': '2s',
            'autovacuum_vacuum_threshold': '50',
            'autovacuum_vacuum_scale_factor': '0.05',
            'log_line_prefix': "'%m [%p] %b %a '",
            'log_min_messages': 'warning',
            'log_error_verbosity': 'default',
            'restart_after_crash': 'on',
            'max_worker_processes': '12',
            'amrtree.pmem_size': self.cfg['pmem_size'],
            'amrtree.ssd_size': self.cfg['ssd_size'],
            'deadlock_timeout': '200ms',
            'checkpoint_timeout': '30s',
        }
        for k, v in self.cfg['extra'].items():
            c[k] = "'%s'" % v
        if self.a.maintenance_work_mem:
            c['maintenance_work_mem'] = "'%s'" % self.a.maintenance_work_mem
        return c

    def write_conf(self, ddir, conf):
        with open(os.path.join(ddir, 'postgresql.conf'), 'a') as f:
            f.write('\n# amr_fuzz\n')
            for k, v in conf.items():
                f.write('%s = %s\n' % (k, v))

    def pg_ctl(self, ddir, what, extra=()):
        lf = os.path.join(self.dir, os.path.basename(ddir) + '.log')
        r = self.as_pg([self.bin('pg_ctl'), '-D', ddir, '-l', lf, '-w', '-t', '120'] + list(extra) + [what],
                       capture_output=True, text=True)
        return r

    def setup_servers(self):
        if os.path.exists(self.dir):
            shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        shutil.chown(self.dir, 'postgres', 'postgres')
        self.logf = open(os.path.join(self.dir, 'fuzz.log'), 'a')
        r = self.as_pg([self.bin('initdb'), '-D', self.pdir, '-A', 'trust', '-N'],
                       capture_output=True, text=True)
        if r.returncode:
            raise SystemExit('initdb failed: ' + r.stderr)
        conf = self.conf_common(self.pport)
        if self.cfg['pool'] == 'shm':
            self.ppool = '/dev/shm/%s-primary.pool' % self.tag
            self.spool = '/dev/shm/%s-standby.pool' % self.tag
            for p in (self.ppool, self.spool):
                if os.path.exists(p):
                    os.unlink(p)
            conf['amrtree.pmem_path'] = "'%s'" % self.ppool
        self.write_conf(self.pdir, conf)
        with open(os.path.join(self.pdir, 'pg_hba.conf'), 'a') as f:
            f.write('host replication all 127.0.0.1/32 trust\n')
        r = self.pg_ctl(self.pdir, 'start')
        if r.returncode:
            raise SystemExit('primary start failed: ' + r.stdout + r.stderr)
        self.as_pg([self.bin('psql'), '-X', '-q', '-h', '127.0.0.1', '-p', str(self.pport),
                    '-d', 'postgres', '-c', 'CREATE DATABASE fuzz'], check=True)
        if not self.a.no_standby:
            r = self.as_pg([self.bin('pg_basebackup'), '-h', '127.0.0.1', '-p', str(self.pport),
                            '-D', self.sdir, '-R', '-X', 'stream', '-c', 'fast'],
                           capture_output=True, text=True)
            if r.returncode:
                raise SystemExit('pg_basebackup failed: ' + r.stderr)
            sconf = {'port': str(self.sport)}
            if self.seed % 2 == 0:
                # every replayed split leaves its inner nodes to the next reader
                sconf['amrtree.fault_injection'] = "'redo:split_unlinked'"
            if self.spool:
                sconf['amrtree.pmem_path'] = "'%s'" % self.spool
            self.write_conf(self.sdir, sconf)
            r = self.pg_ctl(self.sdir, 'start')
            if r.returncode:
                raise SystemExit('standby start failed: ' + r.stdout + r.stderr)

    def psql1(self, port, sql, db='fuzz'):
        r = subprocess.run([self.bin('psql'), '-X', '-q', '-A', '-t', '-h', '127.0.0.1', '-p', str(port),
                            '-U', 'postgres', '-d', db, '-c', sql], capture_output=True, text=True,
                           env=dict(os.environ, PGCONNECT_TIMEOUT='5'))
        return r.returncode, r.stdout, r.stderr

    def create_schema(self):
        g = Gen(random.Random(self.seed))
        s = Sess(self, self.pport, 'setup')
        sql = ['CREATE EXTENSION amrtree;']
        if 'gm' in KIND:
            sql.append('CREATE EXTENSION postgis; CREATE EXTENSION amrtree_postgis;')
        for t in TABLES:
            sql.append('CREATE %sTABLE %s (id bigserial, %s, v int);' % (
                'UNLOGGED ' if t == 'f3' else '', t, table_cols()))
        rows = self.a.rows
        for t, n in (('f1', rows), ('f2', rows // 3), ('f3', rows // 3)):
            for i in range(0, n, 200):
                sql.append(cols('INSERT INTO %s (b, p, pg, c, v) VALUES %s;' %
                                (t, ','.join(g.row() for _ in range(min(200, n - i))))))
        b = self.cfg['budget']
        for col in OPS:
            sql.append("CREATE INDEX f1_%s ON f1 USING amrtree (%s) WITH (pmem_budget = '%s');" % (col, col, b))
            sql.append("CREATE INDEX f2_%s ON f2 USING amrtree (%s) WITH (pmem_budget = '%s', fillfactor = 50) WHERE v %% 2 = 0;" % (col, col, b))
            sql.append("CREATE INDEX f3_%s ON f3 USING amrtree (%s);" % (col, col))
        # f1's builds get parallel workers in any maintenance_work_mem (the
        # option overrides the planner's 32MB per participant), so that in
        # 1MB every participant sorts runs of its own, under the kills
        sql.append('ALTER TABLE f1 SET (parallel_workers = 2);')
        sql.append('VACUUM ANALYZE f1; VACUUM ANALYZE f2; VACUUM ANALYZE f3;')
        rows_, errs = s.run('\n'.join(sql))
        if errs:
            raise SystemExit('schema failed: %s' % errs)
        rows_, errs = s.run('SELECT max(id) FROM f1;')
        self.maxid = int(rows_[0])
        s.close()
        self.wait_standby_catchup()

    def wait_standby_catchup(self, timeout=120):
        if self.a.no_standby:
            return
        rc, out, err = self.psql1(self.pport, 'SELECT pg_current_wal_lsn()')
        if rc:
            return
        lsn = out.strip()
        t0 = now()
        while now() - t0 < timeout:
            rc, out, err = self.psql1(self.sport, "SELECT pg_last_wal_replay_lsn() >= '%s'" % lsn)
            if rc == 0 and out.strip() == 't':
                return True
            time.sleep(0.5)
        self.log('standby did not catch up to %s' % lsn)
        return False

    # ---------------- workers
    def worker_loop(self, name, fn, port_kind):
        rnd = random.Random('%d-%s' % (self.seed, name))
        sess = None
        while not self.stop.is_set():
            down = self.primary_down if port_kind == 'p' else self.standby_down
            if down.is_set() or (port_kind == 's' and self.primary_down.is_set() and False):
                time.sleep(0.2)
                continue
            try:
                if sess is None:
                    sess = Sess(self, self.pport if port_kind == 'p' else self.sport, name)
                    sess.open()
                fn(sess, rnd, name)
            except Lost as e:
                self.bump('lost_connections')
                self.log('%s: lost connection: %s' % (name, e))
                if sess:
                    sess.close()
                sess = None
                time.sleep(0.5)
            except Exception:
                self.fail('fuzzer', dict(where=name, trace=traceback.format_exc()))
                if sess:
                    sess.close()
                sess = None
                time.sleep(1)
        if sess:
            sess.close()

    def x(self, sess, sql, where):
        """Run sql, count it, classify errors; returns (rows, errs)."""
        self.bump('queries', max(1, sql.count(';')))
        rows, errs = sess.run(sql)
        self.errs(errs, where, sql)
        return rows, errs

    # writers ------------------------------------------------------------
    def writer(self, sess, rnd, name):
        self.end_orphans(sess, name)
        g = Gen(rnd)
        t = rnd.choices(['f1', 'f2', 'f3'], [6, 2, 1])[0]
        k = rnd.random()
        lo = rnd.randint(1, max(1, self.maxid))
        pre = ''
        if rnd.random() < 0.2:
            pre = "SET amrtree.budget_on_insert = '%s';" % rnd.choice(['strict', 'defer'])
        if k < 0.35:
            n = rnd.randint(1, 30)
            if rnd.random() < 0.2:   # duplicates of one row
                r1 = g.row()
                vals = ','.join([r1] * n)
            else:
                vals = ','.join(g.row() for _ in range(n))
            sql = pre + cols('INSERT INTO %s (b, p, pg, c, v) VALUES %s RETURNING id;' % (t, vals))
            rows, errs = self.x(sess, sql, name)
            self.note_ids(rows)
        elif k < 0.55:
            col = rnd.choice(list(OPS))
            kind = KIND[col]
            sql = pre + 'UPDATE %s SET %s = %s, v = v + 1 WHERE id BETWEEN %d AND %d;' % (
                t, col, g.val(kind), lo, lo + rnd.randint(0, 20))
            self.x(sess, sql, name)
        elif k < 0.62:
            sql = 'UPDATE %s SET v = v + 2 WHERE id BETWEEN %d AND %d;' % (t, lo, lo + rnd.randint(0, 50))
            self.x(sess, sql, name)     # HOT (v keeps its parity)
        elif k < 0.75:
            # deletes outweigh inserts once the table has grown
            n = rnd.randint(0, 40 if self.maxid < 3 * self.a.rows else 400)
            sql = 'DELETE FROM %s WHERE id BETWEEN %d AND %d;' % (t, lo, lo + n)
            if rnd.random() < 0.15:
                # a region emptied: VACUUM frees the leaves it leaves empty
                x, y = rnd.uniform(-100, 1000), rnd.uniform(-100, 1000)
                sql = 'DELETE FROM %s WHERE b <@ box(point(%r, %r), point(%r, %r));' % (
                    t, x, y, x + rnd.uniform(100, 600), y + rnd.uniform(100, 600))
            self.x(sess, sql, name)
        elif k < 0.82:
            # savepoints rolling back index inserts, some kept
            sql = cols(('BEGIN; INSERT INTO %s (b, p, pg, c, v) VALUES %s; SAVEPOINT a; '
                        'INSERT INTO %s (b, p, pg, c, v) VALUES %s; DELETE FROM %s WHERE id BETWEEN %d AND %d; '
                        'ROLLBACK TO SAVEPOINT a; SAVEPOINT b; INSERT INTO %s (b, p, pg, c, v) VALUES %s; RELEASE b; %s;') % (
                t, g.row(), t, ','.join(g.row() for _ in range(rnd.randint(1, 100))), t, lo, lo + 30,
                t, g.row(), rnd.choice(['COMMIT', 'COMMIT', 'ROLLBACK'])))
            rows, errs = self.x(sess, sql, name)
            if errs:
                sess.run('ROLLBACK;')
        elif k < 0.88:
            # two-phase commit
            gid = 'fz_%s_%d' % (name, rnd.randint(0, 10 ** 9))
            sql = cols(("BEGIN; INSERT INTO %s (b, p, pg, c, v) VALUES %s; DELETE FROM %s WHERE id BETWEEN %d AND %d; "
                        "PREPARE TRANSACTION '%s';") % (
                t, ','.join(g.row() for _ in range(rnd.randint(1, 40))), t, lo, lo + 10, gid))
            try:
                rows, errs = self.x(sess, sql, name)
                if errs:
                    sess.run('ROLLBACK;')
                time.sleep(rnd.random() * 0.3)
                self.x(sess, "%s PREPARED '%s';" % (rnd.choice(['COMMIT', 'COMMIT', 'ROLLBACK']), gid), name)
            except Lost:
                # a kill took the session between PREPARE TRANSACTION and its
                # end: the prepared transaction outlives the crash with its
                # locks, and every DDL on the table would wait lock_timeout
                # for it (and the writers and checkers queued behind that DDL
                # with it) until the end of the run; the next writer ends it
                with self.lock:
                    self.orphans.add(gid)
                raise
        elif k < 0.93:
            # a transaction that rolls back after many inserts
            sql = cols('BEGIN; INSERT INTO %s (b, p, pg, c, v) VALUES %s; UPDATE %s SET b = %s WHERE id BETWEEN %d AND %d; ROLLBACK;' % (
                t, ','.join(g.row() for _ in range(rnd.randint(50, 200))), t, g.val('box'), lo, lo + 20))
            self.x(sess, sql, name)
        elif k < 0.96:
            # fill f2 back when a TRUNCATE emptied it
            sql = 'INSERT INTO f2 (%s) SELECT %s FROM f1 WHERE id BETWEEN %d AND %d;' % (row_cols(), row_cols(), lo, lo + 200)
            self.x(sess, sql, name)
        else:
            # top f1 up to its starting size: the deletes outweigh the
            # inserts, and a table much smaller than that no longer spills
            # when rebuilt in a small maintenance_work_mem (--rows 20000 in
            # 1MB), so the spilled build would go untested after a while
            vals = ','.join(g.row() for _ in range(rnd.randint(200, 600)))
            sql = cols('INSERT INTO f1 (b, p, pg, c, v) SELECT * FROM (VALUES %s) v '
                       'WHERE (SELECT count(*) FROM f1) < %d RETURNING id;' % (vals, self.a.rows))
            rows, errs = self.x(sess, sql, name)
            if self.note_ids(rows):
                self.bump('top_ups')
        self.bump('writes')
        time.sleep(rnd.random() * self.a.write_sleep)

    def note_ids(self, rows):
        """Raise maxid to the largest id an INSERT ... RETURNING id gave
        back; returns whether it gave any."""
        ids = [int(r) for r in rows or [] if r.strip().isdigit()]
        if ids:
            with self.lock:
                self.maxid = max(self.maxid, max(ids))
        return bool(ids)

    def end_orphans(self, sess, name):
        """Commit or roll back the prepared transactions whose writer lost
        its session to a kill (the gid may not exist: the PREPARE or its end
        may have been cut off, or may have completed unanswered).  Chosen
        from the gid, not from the writer's random stream, whose sequence
        stays as the seed makes it."""
        with self.lock:
            orphans = sorted(self.orphans)
            self.orphans = set()
        for i, gid in enumerate(orphans):
            end = 'ROLLBACK' if int(gid.rsplit('_', 1)[1]) % 3 == 0 else 'COMMIT'
            try:
                self.x(sess, "%s PREPARED '%s';" % (end, gid), name)
            except Lost:
                with self.lock:
                    self.orphans.update(orphans[i:])
                raise
            self.bump('orphans_ended')
            self.log('%s: %s PREPARED %s (its writer lost its session)' % (name, end, gid))

    # DDL -----------------------------------------------------------------
    def ddl(self, sess, rnd, name):
        g = Gen(rnd)
        col = rnd.choice(list(OPS))
        t = rnd.choice(list(TABLES))
        idx = '%s_%s' % (t, col)
        k = rnd.random()
        concurrent = False
        pred = ' WHERE v % 2 = 0' if t == 'f2' else ''
        b = self.cfg['budget']
        if k < 0.10:
            sql = rnd.choice(['VACUUM %s;', 'VACUUM (ANALYZE) %s;', 'VACUUM (FREEZE) %s;',
                              'VACUUM (INDEX_CLEANUP on) %s;']) % t
        elif k < 0.18:
            sql = 'REINDEX INDEX %s;' % idx
        elif k < 0.28:
            sql = rnd.choice(['REINDEX INDEX CONCURRENTLY %s;' % idx, DROP_INVALID + ' REINDEX TABLE CONCURRENTLY %s;' % t])
            concurrent = True
        elif k < 0.38:
            extra = '%s_%s_x' % (t, col)
            sql = ("DROP INDEX CONCURRENTLY IF EXISTS %s; CREATE INDEX CONCURRENTLY %s ON %s USING amrtree (%s) "
                   "WITH (pmem_budget = '%s')%s;") % (extra, extra, t, col, rnd.choice([b, '1%', 'unlimited', '8kB']), pred)
            concurrent = True
        elif k < 0.42:
            sql = 'VACUUM FULL %s;' % t
        elif k < 0.46:
            sql = 'CLUSTER f1 USING f1_%s;' % col
        elif k < 0.52:
            if t == 'f2' and rnd.random() < 0.5:
                end = 'COMMIT'
            else:
                end = 'ROLLBACK'
            sql = cols('BEGIN; TRUNCATE %s; INSERT INTO %s (b, p, pg, c, v) VALUES %s; %s;' % (
                t, t, ','.join(g.row() for _ in range(20)), end))
        elif k < 0.57:
            sql = cols(("BEGIN; CREATE INDEX fz_tmp ON %s USING amrtree (%s); INSERT INTO %s (b, p, pg, c, v) VALUES %s; "
                        "SAVEPOINT s; CREATE INDEX fz_tmp2 ON %s USING amrtree (b); ROLLBACK TO s; %s;") % (
                t, col, t, g.row(), t, rnd.choice(['ROLLBACK', 'ROLLBACK', 'COMMIT; DROP INDEX fz_tmp'])))
        elif k < 0.60:
            # documented refusal: PREPARE TRANSACTION with an index created
            sql = "BEGIN; CREATE INDEX fz_tmp3 ON %s USING amrtree (b); PREPARE TRANSACTION 'fz_ddl_%d';" % (t, rnd.randint(0, 10 ** 9))
        elif k < 0.68:
            sql = "ALTER INDEX %s SET (pmem_budget = '%s');" % (idx, rnd.choice(['1%', '5%', '50%', 'unlimited', '4kB', '100kB', '1MB']))
            if rnd.random() < 0.3:
                sql = "ALTER INDEX %s SET (tiering = %s);" % (idx, rnd.choice(['on', 'off', 'on']))
        elif k < 0.78:
            setting, val = rnd.choice([
                ('amrtree.scan_interval', rnd.choice(['50ms', '100ms', '1s'])),
                ('amrtree.decay_lambda', rnd.choice(['0.1', '2', '0.01'])),
                ('amrtree.promote_threshold', rnd.choice(['1', '4', '10'])),
                ('amrtree.demote_threshold', rnd.choice(['0.5', '3', '0.01'])),
                ('amrtree.pmem_high_watermark', rnd.choice(['0', '5', '90', '100'])),
                ('amrtree.pmem_low_watermark', rnd.choice(['0', '3', '80'])),
                ('amrtree.update_ratio_threshold', rnd.choice(['0.1', '0.5', '0.9'])),
                ('amrtree.smo_threshold', rnd.choice(['1', '3', '10'])),
                ('amrtree.writeback_delay', rnd.choice(['10ms', '200ms', '1s'])),
                ('amrtree.io_method', rnd.choice(['sync', 'io_uring'])),
                ('amrtree.auto_rebuild', rnd.choice(['on', 'off', 'on'])),
            ])
            sql = "ALTER SYSTEM SET %s = '%s'; SELECT pg_reload_conf();" % (setting, val)
        elif k < 0.86:
            sql = 'SELECT amrtree_settle(%s, %s);' % (
                "'%s'" % idx, rnd.choice(['0', '0.1', '0.3']))
        elif k < 0.92:
            sql = ("SELECT * FROM amrtree_index_stats('%s'); SELECT * FROM amrtree_tier_stats('%s');"
                   "SELECT * FROM amrtree_migration_stats('%s'); SELECT count(*) FROM amrtree_leaf_table('%s');"
                   "SELECT count(*) FROM amrtree_leaf_entries('%s'); SELECT * FROM amrtree_pool_stats();"
                   "SELECT * FROM amrtree_ssd_cache_stats();") % (idx, idx, idx, idx, idx)
        elif k < 0.97:
            self.check_indexes(sess, self.pport, name)
            return
        elif k < 0.99:
            sql = DROP_INVALID
        else:
            sql = 'CHECKPOINT;'
        t0 = time.time()
        rows, errs = self.x(sess, sql, name)
        t1 = time.time()
        if errs:
            sess.run('ROLLBACK;')
        if concurrent:
            with self.lock:
                self.rebuilds.append((t0, t1))
        self.bump('ddl')
        self.log('%s: %s%s' % (name, sql[:150], ' -> %s' % errs if errs else ''))
        time.sleep(rnd.random() * self.a.ddl_sleep)

    def index_names(self, sess, port):
        rows, errs = sess.run("SELECT c.relname FROM pg_class c JOIN pg_am a ON a.oid = c.relam "
                              "WHERE a.amname = 'amrtree' AND c.relkind = 'i' "
                              # other sessions' temporary indexes: not ours to read
                              "AND c.relpersistence <> 't' ORDER BY 1;")
        return [r for r in rows if r] if not errs else []

    def check_indexes(self, sess, port, name):
        """amrtree_check on every amrtree index (and the pool: superuser)."""
        for idx in self.index_names(sess, port):
            sql = "SELECT amrtree_check('%s');" % idx
            self.bump('queries')
            rows, errs = sess.run(sql)
            for e in errs:
                if EXPECTED_RE.search(e) or 'does not exist' in e:
                    self.bump('expected_errors')
                else:
                    self.fail('check', dict(where=name, port=port, index=idx, error=e))

    # checkers -----------------------------------------------------------
    def make_query(self, rnd, g, mode, t, col):
        op, kind = rnd.choice(OPS[col])
        arg = g.val(kind, nullp=0.0)
        if rnd.random() < 0.05:
            # a query value with NaN / infinite / huge coordinates
            arg = {'box': "'((NaN,1),(3,4))'::box", 'point': "point('NaN'::float8, 1)",
                   'polygon': "'((0,0),(Infinity,0),(0,1e150))'::polygon",
                   'circle': "'<(1e150,-1e150),Infinity>'::circle",
                   'geometry': "ST_MakeEnvelope('NaN', 1, 3, 'Infinity')"}[kind]
        if rnd.random() < 0.03:
            arg = {'box': "'((-Infinity,-Infinity),(Infinity,Infinity))'::box",
                   'point': 'point(500,500)', 'polygon': "'((-1e150,-1e150),(1e150,1e150),(1e150,-1e150))'::polygon",
                   'circle': "'<(500,500),1e150>'::circle",
                   'geometry': "ST_MakeEnvelope('-Infinity', '-Infinity', 'Infinity', 'Infinity')"}[kind]
        where = '%s %s %s%s' % (col, op, arg, TABLES.get(t, ''))
        if rnd.random() < 0.05:
            where = '%s IS %sNULL%s' % (col, rnd.choice(['', 'NOT ']), TABLES.get(t, ''))
        if mode == 'ios':
            return 'SELECT count(*), md5(coalesce(string_agg(%s::text, \',\' ORDER BY %s::text), \'\')) FROM %s WHERE %s' % (col, col, t, where)
        return 'SELECT count(*), md5(coalesce(string_agg(id::text, \',\' ORDER BY id), \'\')) FROM %s WHERE %s' % (t, where)

    def knn_query(self, rnd, g, t, col, limit, ios=False):
        x, y = g.pt()
        q = ('ST_MakePoint(%s)' if col == 'gm' else 'point(%s)') % g.plit(x, y)
        cond = ''
        if rnd.random() < 0.3:
            op, kind = rnd.choice([o for o in OPS[col] if o[0] in ('&&', '<@', '<<', '>>')] or OPS[col])
            cond = ' AND %s %s %s' % (col, op, g.val(kind, nullp=0))
        sel = col if ios else 'id'
        # the distance itself is compared, ties may come in any order
        return ('SELECT %s <-> %s FROM %s WHERE true%s%s ORDER BY %s <-> %s LIMIT %d' % (
            col, q, t, TABLES.get(t, ''), cond, col, q, limit), sel)

    def checker(self, sess, rnd, name, port):
        g = Gen(rnd)
        standby = port == self.sport
        nq = rnd.randint(1, 6)
        t0 = time.time()
        temp = not standby and rnd.random() < 0.1
        if temp:
            # a temporary table of this session, with amrtree indexes whose
            # leaves are keyed by the session; changed before each batch
            rows_, errs = self.x(sess, "CREATE TEMP TABLE IF NOT EXISTS tt (id serial, %s, v int); " % table_cols() + ' '.join(
                                     'CREATE INDEX IF NOT EXISTS tt_%s ON tt USING amrtree (%s);' % (c, c) for c in OPS) +
                                 cols('INSERT INTO tt (b, p, pg, c, v) VALUES %s; DELETE FROM tt WHERE id %% %d = 0;%s' % (
                                     ','.join(g.row() for _ in range(rnd.randint(1, 150))), rnd.randint(2, 9),
                                     rnd.choice(['', ' VACUUM tt;', ' REINDEX TABLE tt;', ' TRUNCATE tt;']))), name)
            if errs:
                return
        parts = ['BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;', 'SELECT 1 AS snap;']
        pending = []
        explain = rnd.random() < self.a.explain_rate
        for i in range(nq):
            t = 'tt' if temp and rnd.random() < 0.7 else rnd.choices(['f1', 'f2', 'f3'], [8, 2, 0 if standby else 1])[0]
            col = rnd.choice(list(OPS))
            r = rnd.random()
            if r < 0.55:
                mode = rnd.choice(['index', 'bitmap', 'ios' if col in IOS_COLS else 'index'])
                q = self.make_query(rnd, g, mode, t, col)
                pending.append((i, mode, q, None))
                if explain:
                    parts.append(PLAN[mode] + ' EXPLAIN (COSTS OFF) ' + q + ';')
                parts.append(PLAN[mode] + " SELECT 'Q%d', * FROM (%s) s;" % (i, q))
                parts.append(PLAN['seq'] + " SELECT 'R%d', * FROM (%s) s;" % (i, q))
            elif r < 0.85:
                limit = rnd.choice([1, 5, 10, 50, 1000])
                q, sel = self.knn_query(rnd, g, t, col, limit)
                mode = 'knn-ios' if col in IOS_COLS and rnd.random() < 0.5 else 'knn'
                plan = PLAN['ios'] if mode == 'knn-ios' else PLAN['index']
                agg = 'SELECT count(*), md5(coalesce(string_agg(coalesce(d::text, \'N\'), \',\' ORDER BY n), \'\')) FROM (SELECT d, row_number() over () AS n FROM (%s) k(d)) s' % q
                pending.append((i, mode, q, None))
                if explain:
                    parts.append(plan + ' EXPLAIN (COSTS OFF) ' + q + ';')
                parts.append(plan + " SELECT 'Q%d', * FROM (%s) s;" % (i, agg))
                parts.append(PLAN['seq'] + " SELECT 'R%d', * FROM (%s) s;" % (i, agg))
            else:
                # a cursor fetched partially, in two parts with a pause
                # between them (writers, VACUUM and the tier manager go on),
                # then the same rows by a sequential scan
                a, b = rnd.choice([1, 3, 20, 200]), rnd.choice([1, 2, 50, 500])
                cname = 'c%d' % i
                if rnd.random() < 0.6:
                    q, sel = self.knn_query(rnd, g, t, col, 100000)
                    mode = 'cursor'
                    seqq = "SELECT d FROM (%s) s(d) LIMIT %d" % (q, a + b)
                    plan = PLAN[rnd.choice(['index', 'ios' if col in IOS_COLS else 'index'])]
                else:
                    # unordered: every row, compared as a set
                    mode = 'cursor-set'
                    w = self.make_query(rnd, g, 'index', t, col)
                    w = w[w.index(' WHERE ') + 7:]
                    q = 'SELECT id FROM %s WHERE %s' % (t, w)
                    seqq = q + ' ORDER BY id'
                    plan = PLAN[rnd.choice(['index', 'bitmap'])]
                    b = 'ALL'
                pending.append((i, mode, q, a))
                parts.append(plan + ' DECLARE %s NO SCROLL CURSOR FOR %s;' % (cname, q))
                parts.append("SELECT 'C%d';" % i)
                parts.append("FETCH %d FROM %s;" % (a, cname))
                parts.append("SELECT 'x' FROM pg_sleep(%s) WHERE false;" % rnd.choice(['0', '0.05', '0.3']))
                parts.append("FETCH %s FROM %s;" % (b, cname))
                parts.append("SELECT 'E%d';" % i)
                parts.append(PLAN['seq'] + ' ' + seqq + ';')
                parts.append("SELECT 'F%d';" % i)
                parts.append('CLOSE %s;' % cname)
        if standby:
            # indexes whose tree the planner may use but this snapshot's
            # catalog does not show as that valid index (a concurrent rebuild
            # or a rewrite replayed after the snapshot was taken): the
            # documented standby limit applies to answers through them
            names = ','.join("'%s_%s%s'" % (t, c, x) for t in TABLES for c in OPS
                             for x in ('', '_x', '_ccnew', '_x_ccnew', '_ccnew1'))
            parts.append("SELECT 'IDX', count(*), 0 FROM unnest(ARRAY[%s]) n WHERE to_regclass(n) IS NOT NULL "
                         "AND NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                         "WHERE i.indexrelid = to_regclass(n) AND i.indisvalid "
                         "AND c.relfilenode = pg_relation_filenode(to_regclass(n)));" % names)
        parts.append('COMMIT;')
        sql = '\n'.join(parts)
        self.bump('queries', len(pending) * 2)
        rows, errs = sess.run(sql)
        t1 = time.time()
        if errs:
            # the batch stops at its first error: the statement after the
            # last tagged result printed (or the first one) raised it
            tags = [line.split('|', 1)[0] for line in rows if re.match(r'^[QRCEF]\d+(\||$)', line)]
            lines = sql.split('\n')
            at = next((i for i, ln in enumerate(lines) if tags and "'%s'" % tags[-1] in ln), 1)
            failed_at = lines[min(at + 1, len(lines) - 1)]
            unexpected = self.errs(errs, name, sql, failed_at=failed_at[:1500], standby=standby)
            sess.run('ROLLBACK;')
            if unexpected:
                self.dump_table(failed_at, '%s: %s' % (name, unexpected[0]))
            return
        res = {}
        stale = 0
        fetched, seq = {}, {}
        state = None
        for line in rows:
            f = line.split('|')
            if f[0] == 'IDX' and len(f) == 3:
                stale = int(f[1])
                continue
            m = re.match(r'^([QRCEF])(\d+)$', f[0])
            if m and (len(f) == 3 or (len(f) == 1 and m.group(1) in 'CEF')):
                i = int(m.group(2))
                kind = m.group(1)
                if kind in 'QR':
                    res[f[0]] = (f[1], f[2])
                elif kind == 'C':
                    state = ('fetch', i)
                    fetched[i] = []
                elif kind == 'E':
                    state = ('seq', i)
                    seq[i] = []
                else:
                    state = None
                continue
            if state is not None:
                (fetched if state[0] == 'fetch' else seq)[state[1]].append(line)
                continue
            s = line.lstrip()
            if s.startswith('->'):
                s = s[2:].lstrip()
            if s.startswith(('Index Scan', 'Index Only Scan', 'Bitmap Index Scan')):
                if re.search(r'(using|on) f[12]_', s):
                    self.bump('plans_amrtree')
                else:
                    self.bump('plans_other')
            elif s.startswith('Seq Scan'):
                self.bump('plans_other')
        pass
        for (i, mode, q, limit) in pending:
            if mode in ('cursor', 'cursor-set'):
                if i not in fetched or i not in seq:
                    self.fail('fuzzer', dict(where=name, why='missing cursor output', i=i, rows=rows[:80]))
                    continue
                self.bump('comparisons')
                if mode == 'cursor-set':
                    fetched[i] = sorted(fetched[i], key=lambda x: int(x) if x.isdigit() else -1)
                if fetched[i] != seq[i]:
                    self.mismatch(sess, name, standby, mode, q + ' (first %d, then more)' % limit,
                                  fetched[i][:50], seq[i][:50], t0, t1, stale)
                continue
            qa, ra = res.get('Q%d' % i), res.get('R%d' % i)
            if qa is None or ra is None:
                self.fail('fuzzer', dict(where=name, why='missing result', i=i, rows=rows[:50], sql=sql))
                continue
            self.bump('comparisons')
            if qa != ra:
                self.mismatch(sess, name, standby, mode, q, qa, ra, t0, t1, stale)

    def mismatch(self, sess, name, standby, mode, q, qa, ra, t0, t1, stale=0):
        if standby:
            if stale:
                # docs/user-guide.md, Limits: a standby snapshot older than a
                # concurrent rebuild's commit may miss rows; count, not fail
                self.bump('standby_doc_limit')
                self.log('%s: standby mismatch during a concurrent rebuild (documented limit): %s %s %s %s' % (
                    name, mode, q, qa, ra))
                return
        detail = dict(where=name, standby=standby, mode=mode, query=q, index=qa, seq=ra)
        # gather the full rows for the report, in a new snapshot (may differ)
        try:
            plan = PLAN['ios' if mode in ('ios', 'knn-ios') else ('bitmap' if mode == 'bitmap' else 'index')]
            r1, e1 = sess.run('BEGIN ISOLATION LEVEL REPEATABLE READ; %s EXPLAIN (COSTS OFF) %s; '
                              "SELECT 'Q', * FROM (%s) s; %s SELECT 'R', * FROM (%s) s; COMMIT;" % (
                                  plan, q, q, PLAN['seq'], q))
            detail['explain_and_rerun'] = r1[:200]
            detail['rerun_errors'] = e1
            qrows = [x for x in r1 if x.startswith('Q|')]
            detail['rerun_same'] = qrows == [x.replace('R|', 'Q|', 1) for x in r1 if x.startswith('R|')]
        except Lost:
            pass
        self.fail('mismatch', detail)
        self.dump_table(q, '%s mismatch' % name)

    def dump_table(self, sql, why):
        """Copy the table sql reads, on the primary, as it is now: for
        replaying a failed comparison offline (the rows that caused it are
        most likely still there)."""
        m = re.search(r' FROM (f[123]) ', sql)
        if not m:
            return
        dump = 'fz_dump_%d' % int(time.time() * 1000)
        rc, out, err = self.psql1(self.pport, 'CREATE TABLE %s AS SELECT * FROM %s' % (dump, m.group(1)))
        self.log('copied %s to %s after %s%s' % (m.group(1), dump, why, (': ' + err.strip()) if rc else ''))

    # killer ---------------------------------------------------------------
    def children(self, pid):
        out = []
        for d in os.listdir('/proc'):
            if not d.isdigit():
                continue
            try:
                with open('/proc/%s/stat' % d) as f:
                    st = f.read()
                ppid = int(st[st.rindex(')') + 2:].split()[1])
                if ppid == pid:
                    out.append(int(d))
            except Exception:
                pass
        return out

    def postmaster_pid(self, ddir):
        try:
            with open(os.path.join(ddir, 'postmaster.pid')) as f:
                return int(f.readline())
        except Exception:
            return None

    def wait_ready(self, port, timeout=180):
        t0 = now()
        while now() - t0 < timeout:
            rc, out, err = self.psql1(port, 'SELECT 1')
            if rc == 0:
                return True
            time.sleep(0.5)
        return False

    def killer(self, rnd):
        while not self.stop.wait(rnd.uniform(self.a.kill_every * 0.5, self.a.kill_every * 1.5)):
            what = rnd.choices(['backend', 'worker', 'primary', 'standby', 'fault', 'sfault'],
                               [3, 1, 2, 0 if self.a.no_standby else 2, 4, 0 if self.a.no_standby else 2])[0]
            self.kills.append(time.time())
            self.bump('crashes_injected')
            if what == 'sfault':
                # a crash of the standby's startup process inside replay
                # (docs/user-guide.md, "Testing crash safety"): the standby
                # stops, and is started again
                point = '%s:%d' % (rnd.choice(['redo:before_append', 'redo:before_switch', 'redo:before_split']),
                                   rnd.randint(1, 200))
                fired = os.path.join(self.sdir, 'amrtree_fault_fired')
                if os.path.exists(fired):
                    os.unlink(fired)
                self.log('STANDBY FAULT armed: %s' % point)
                self.psql1(self.sport, "ALTER SYSTEM SET amrtree.fault_injection = '%s'" % point)
                self.psql1(self.sport, 'SELECT pg_reload_conf()')
                t0 = now()
                while now() - t0 < 40 and not os.path.exists(fired) and not self.stop.is_set():
                    time.sleep(0.5)
                if os.path.exists(fired):
                    self.log('STANDBY FAULT fired: %s' % point)
                    self.bump('faults_fired')
                    self.standby_down.set()
                    pm = self.postmaster_pid(self.sdir)
                    for _ in range(60):
                        if not pm or not os.path.exists('/proc/%d' % pm):
                            break
                        time.sleep(0.5)
                    r = self.pg_ctl(self.sdir, 'start')
                    if r.returncode or not self.wait_ready(self.sport):
                        self.fail('server', dict(why='standby did not restart after %s' % point, out=r.stdout + r.stderr))
                        self.stop.set()
                        return
                    self.standby_down.clear()
                self.psql1(self.sport, 'ALTER SYSTEM RESET amrtree.fault_injection')
                self.psql1(self.sport, 'SELECT pg_reload_conf()')
                if os.path.exists(fired):
                    self.after_crash(self.sport)
                continue
            if what == 'fault':
                point = '%s:%d' % (rnd.choice(FAULT_POINTS), rnd.randint(1, 20))
                fired = os.path.join(self.pdir, 'amrtree_fault_fired')
                if os.path.exists(fired):
                    os.unlink(fired)
                self.log('FAULT armed: %s' % point)
                self.psql1(self.pport, "ALTER SYSTEM SET amrtree.fault_injection = '%s'" % point)
                self.psql1(self.pport, 'SELECT pg_reload_conf()')
                t0 = now()
                while now() - t0 < 40 and not os.path.exists(fired) and not self.stop.is_set():
                    time.sleep(0.5)
                hit = os.path.exists(fired)
                if hit:
                    self.log('FAULT fired: %s' % point)
                    self.bump('faults_fired')
                    time.sleep(2)
                if not self.wait_ready(self.pport):
                    self.fail('server', dict(why='primary not back after fault %s' % point))
                self.psql1(self.pport, 'ALTER SYSTEM RESET amrtree.fault_injection')
                self.psql1(self.pport, 'SELECT pg_reload_conf()')
                if hit:
                    self.after_crash(self.pport)
                    if not self.a.no_standby:
                        self.after_crash(self.sport)
                continue
            if what in ('backend', 'worker'):
                if what == 'backend':
                    q = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name LIKE 'fz-%' AND pid <> pg_backend_pid()"
                else:
                    q = "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'amrtree%'"
                port = self.pport if what == 'worker' or rnd.random() < 0.7 or self.a.no_standby else self.sport
                rc, out, err = self.psql1(port, q)
                pids = [int(x) for x in out.split() if x.strip().isdigit()]
                if not pids:
                    continue
                pid = rnd.choice(pids)
                self.log('KILL -9 %s %d on port %d' % (what, pid, port))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.bump('backend_kills')
                time.sleep(2)
                if not self.wait_ready(port):
                    self.fail('server', dict(why='server not back after killing a backend', port=port))
                self.after_crash(port)
            else:
                ddir = self.pdir if what == 'primary' else self.sdir
                port = self.pport if what == 'primary' else self.sport
                down = self.primary_down if what == 'primary' else self.standby_down
                pm = self.postmaster_pid(ddir)
                if not pm:
                    continue
                down.set()
                kids = self.children(pm)
                self.log('KILL -9 %s postmaster %d and its %d children' % (what, pm, len(kids)))
                for p in [pm] + kids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.bump('%s_kills' % what)
                time.sleep(1)
                for _ in range(60):
                    if not any(os.path.exists('/proc/%d' % p) for p in [pm] + kids):
                        break
                    time.sleep(0.5)
                r = self.pg_ctl(ddir, 'start')
                if r.returncode or not self.wait_ready(port):
                    self.fail('server', dict(why='%s did not restart' % what, out=r.stdout + r.stderr))
                    self.stop.set()
                    return
                down.clear()
                self.after_crash(port)

    def after_crash(self, port):
        """amrtree_check on every index, then a parity sweep."""
        time.sleep(1)
        if port == self.sport:
            self.wait_standby_catchup(60)
        s = Sess(self, port, 'aftercrash')
        try:
            s.open()
            if port == self.pport:
                s.run(DROP_INVALID)
            self.check_indexes(s, port, 'after-crash:%d' % port)
            rnd = random.Random(self.seed * 7 + len(self.kills))
            for _ in range(5):
                self.checker(s, rnd, 'after-crash:%d' % port, port)
        except Lost as e:
            self.log('after-crash session lost: %s' % e)
        finally:
            s.close()

    # ---------------- main
    def scan_logs(self):
        """Suspicious lines in the server logs."""
        bad = []
        for n in ('primary.log', 'standby.log'):
            p = os.path.join(self.dir, n)
            if not os.path.exists(p):
                continue
            with open(p, errors='replace') as f:
                for line in f:
                    if LOG_BAD_RE.search(line) and not LOG_OK_RE.search(line) \
                            and not is_expected(line, n == 'standby.log') and 'STATEMENT' not in line \
                            and 'HINT:' not in line:
                        bad.append('%s: %s' % (n, line.rstrip()))
        return bad

    def run(self):
        self.setup_servers()
        self.create_schema()
        threads = []
        t_end = now() + self.a.duration
        for i in range(self.a.writers):
            threads.append(threading.Thread(target=self.worker_loop, args=('w%d' % i, self.writer, 'p')))
        for i in range(self.a.ddl_workers):
            threads.append(threading.Thread(target=self.worker_loop, args=('ddl%d' % i, self.ddl, 'p')))
        for i in range(self.a.checkers):
            threads.append(threading.Thread(target=self.worker_loop, args=(
                'cp%d' % i, lambda s, r, n: self.checker(s, r, n, self.pport), 'p')))
        if not self.a.no_standby:
            for i in range(self.a.checkers):
                threads.append(threading.Thread(target=self.worker_loop, args=(
                    'cs%d' % i, lambda s, r, n: self.checker(s, r, n, self.sport), 's')))
        if self.a.kill_every > 0:
            threads.append(threading.Thread(target=self.killer, args=(random.Random(self.seed * 13),)))
        for t in threads:
            t.daemon = True
            t.start()
        last = now()
        while now() < t_end and not self.stop.is_set():
            time.sleep(1)
            if self.stats['mismatches'] and self.a.stop_on_mismatch:
                break
            if now() - last > 30:
                last = now()
                print('  [seed %d %s] %s' % (self.seed, self.a.config, json.dumps(self.stats)), flush=True)
        self.stop.set()
        for t in threads:
            t.join(120)
        # final: catch up, check and compare everywhere
        self.wait_ready(self.pport)
        for port in [self.pport] + ([] if self.a.no_standby else [self.sport]):
            if port == self.sport:
                self.wait_standby_catchup()
            s = Sess(self, port, 'final')
            try:
                s.open()
                s.run("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE false;")
                if port == self.pport:
                    rows, errs = s.run('SELECT gid FROM pg_prepared_xacts;')
                    for gid in rows:
                        if gid:
                            s.run("ROLLBACK PREPARED '%s';" % gid)
                self.check_indexes(s, port, 'final:%d' % port)
                if port == self.pport:
                    rows, errs = s.run('SELECT count(*) FROM f1;')
                    if rows and rows[0].strip().isdigit():
                        self.stats['final_rows_f1'] = int(rows[0])
                rnd = random.Random(self.seed * 17 + port)
                for _ in range(20):
                    self.checker(s, rnd, 'final:%d' % port, port)
            except Lost as e:
                self.fail('server', dict(why='final session lost', port=port, e=str(e)))
            finally:
                s.close()
        bad = self.scan_logs()
        for b in bad[:50]:
            self.fail('log', dict(line=b))
        return bad

    def shutdown(self):
        for d in (self.sdir, self.pdir):
            if os.path.exists(os.path.join(d, 'postmaster.pid')):
                self.pg_ctl(d, 'stop', ['-m', 'fast'])
        for p in (self.ppool, self.spool):
            if p and os.path.exists(p):
                os.unlink(p)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--seed', type=int, default=None)
    ap.add_argument('--config', choices=sorted(CONFIGS), default='disk')
    ap.add_argument('--duration', type=float, default=300, help='seconds of fuzzing')
    ap.add_argument('--dir', default=None, help='work directory (data dirs, logs)')
    ap.add_argument('--pgbin', default=os.environ.get('AMR_PG_BIN', '/usr/lib/postgresql/15/bin'))
    ap.add_argument('--port', type=int, default=55201, help='primary port; the standby uses port+1')
    ap.add_argument('--rows', type=int, default=6000)
    ap.add_argument('--writers', type=int, default=3)
    ap.add_argument('--checkers', type=int, default=2, help='checkers per server')
    ap.add_argument('--ddl-workers', type=int, default=1)
    ap.add_argument('--kill-every', type=float, default=60, help='mean seconds between kills; 0: none')
    ap.add_argument('--write-sleep', type=float, default=0.05)
    ap.add_argument('--ddl-sleep', type=float, default=1.0)
    ap.add_argument('--explain-rate', type=float, default=0.1,
                    help='share of checker batches that EXPLAIN their forced plans (counted as plans_amrtree)')
    ap.add_argument('--no-standby', action='store_true')
    ap.add_argument('--maintenance-work-mem',
                    help="e.g. 1MB: builds and rebuilds of more than 16,131 rows (--rows 20000) "
                    "sort them in runs on temporary files")
    ap.add_argument('--postgis', action='store_true',
                    help='also a PostGIS geometry column with an amrtree_postgis index')
    ap.add_argument('--stop-on-mismatch', action='store_true')
    ap.add_argument('--keep', action='store_true', help='leave the servers running at the end')
    ap.add_argument('-v', '--verbose', action='store_true')
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.randrange(1, 10 ** 6)
    if a.dir is None:
        a.dir = '/tmp/amr_fuzz-%d' % a.seed
    if a.postgis:
        enable_postgis()
    fz = Fuzz(a)
    start = time.time()
    print('amr_fuzz: seed %d config %s duration %ds dir %s' % (a.seed, a.config, a.duration, a.dir), flush=True)
    try:
        fz.run()
    except SystemExit as e:
        print(e)
        fz.failures.append(dict(kind='setup', detail=str(e)))
    finally:
        if not a.keep:
            fz.shutdown()
    summary = dict(seed=a.seed, config=a.config, minutes=round((time.time() - start) / 60, 1),
                   **fz.stats, failures=len(fz.failures))
    with open(os.path.join(fz.dir, 'summary.json'), 'w') as f:
        json.dump(dict(summary=summary, failures=fz.failures), f, indent=1)
    print('amr_fuzz summary: ' + json.dumps(summary))
    for fl in fz.failures[:20]:
        print('  FAILURE %s: %s' % (fl['kind'], json.dumps(fl['detail'])[:1500]))
    if fz.failures:
        print('reproduce: %s --seed %d --config %s --duration %d%s (logs and failing queries in %s)' % (
            sys.argv[0], a.seed, a.config, a.duration, ' --postgis' if a.postgis else '', fz.dir))
    sys.exit(1 if fz.failures else 0)


if __name__ == '__main__':
    main()
