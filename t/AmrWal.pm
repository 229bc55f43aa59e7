# Helpers for amrtree's WAL tests (standbys, point-in-time recovery, crashes
# during replay): index-vs-sequential-scan parity and result digests that
# never die (a failing query becomes a failed assertion, and the test goes
# on), pgbench load in the background that survives server restarts, and
# process handling for crashes.  Builds on AmrTree.pm.
package AmrWal;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);
use AmrTree;

our @EXPORT = qw(amrwal_primary amrwal_scripts amrwal_setup amrwal_windows amrwal_query amrwal_parity
  amrwal_digest amrwal_heap_digest amrwal_same_digest amrwal_check amrwal_shape
  amrwal_start_load amrwal_stop_load amrwal_load_ok
  amrwal_child_pids amrwal_wait_pids_gone amrwal_startup_pid
  amrwal_explain amrwal_pm_pid amrwal_catchup);

# The strategies a parity check runs on every window; the others (which
# match large parts of the table) run on every $all_every-th window.
our @SELECTIVE = ('&&', '@>', '<@', '~=');

# The primary of a WAL test: pool and slot file at their defaults, inside
# the data directory (so that a base backup copies them), small enough to
# copy quickly; $rows Porto-like boxes in trips (ids from trip_ids for the
# loads below) with an amrtree index at a 50% budget, so that some leaves
# are on the SSD tier.  Options: archiving => 1, rows, seed.
sub amrwal_primary
{
	my ($name, %opt) = @_;
	my $node = amr_node($name, pool => undef, pmem_size => '64MB',
		init => { allows_streaming => 1, $opt{archiving} ? (has_archiving => 1) : () },
		conf => q{
amrtree.ssd_size = 32MB
autovacuum = off
shared_buffers = 16MB
max_connections = 30
wal_keep_size = 256MB
log_statement = ddl
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION amrtree; CREATE SEQUENCE trip_ids START 1000000');
	amr_load_porto($node, 'trips', $opt{rows} || 20000, $opt{seed} || 13);
	$node->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b) WITH (pmem_budget = '50%');
VACUUM ANALYZE trips;});
	return $node;
}

# pgbench scripts for loads on trips: inserts spread over the area (ins),
# inserts into one dense corner, which split leaves often (hot), deletes of
# a few rows of a random window (del), VACUUM (vac).
my %load_scripts = (
	ins => q{
\set x random(0, 12000)
\set y random(0, 8500)
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.688 + :x * 0.00001, 41.098 + :y * 0.00001),
  point(-8.688 + :x * 0.00001 + random() * 0.002, 41.098 + :y * 0.00001 + random() * 0.0015)), 0;
},
	hot => q{
\set x random(0, 1000)
\set y random(0, 800)
INSERT INTO trips (id, b, t)
SELECT nextval('trip_ids'), box(point(-8.615 + :x * 0.00001, 41.145 + :y * 0.00001),
  point(-8.615 + :x * 0.00001 + random() * 0.0005, 41.145 + :y * 0.00001 + random() * 0.0004)), 0;
},
	# two clients deleting overlapping windows could deadlock on row locks
	# (PostgreSQL aborts one, which the load reports as a failure): each
	# skips the rows the other holds
	del => q{
\set x random(0, 12000)
\set y random(0, 8500)
DELETE FROM trips WHERE ctid IN (SELECT ctid FROM trips
  WHERE b && box(point(-8.688 + :x * 0.00001, 41.098 + :y * 0.00001),
                 point(-8.688 + :x * 0.00001 + 0.004, 41.098 + :y * 0.00001 + 0.004))
  LIMIT 10 FOR UPDATE SKIP LOCKED);
},
	vac => q{
VACUUM trips;
},
);

# The scripts argument of amrwal_start_load for some of the scripts above,
# with their pgbench weights: amrwal_scripts(ins => 4, del => 1).
sub amrwal_scripts
{
	my (%weight) = @_;
	return { map { $_ => [ $load_scripts{$_}, $weight{$_} ] } keys %weight };
}

# amr_ops and amr_ids (AmrTree.pm), plus amrwal_ids(tbl, op, qb, mode): the
# ids a query returns with one access path forced.  mode 'seq': sequential
# scan; 'index': plain index scan (bitmap scans off); 'bitmap': bitmap index
# scan (plain index scans off).  'index' and 'bitmap' raise an error unless
# the plan really uses an amrtree index that way.  Run it on the primary
# before any standby is made: the functions replicate.
sub amrwal_setup
{
	my ($node, $db) = @_;
	$db ||= 'postgres';
	amr_setup_parity($node, $db);
	$node->safe_psql(
		$db, q{
CREATE OR REPLACE FUNCTION amrwal_plan_uses_amrtree(plan text, pattern text)
RETURNS bool LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_am a ON a.oid = c.relam
                 WHERE a.amname = 'amrtree'
                   AND c.relname = substring(plan FROM pattern))
$$;
CREATE OR REPLACE FUNCTION amrwal_ids(tbl regclass, op text, qb box, mode text)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE b %s %L::box', tbl, op, qb);
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', (mode = 'seq')::text, true);
  PERFORM set_config('enable_indexscan', (mode = 'index')::text, true);
  PERFORM set_config('enable_indexonlyscan', (mode = 'index')::text, true);
  PERFORM set_config('enable_bitmapscan', (mode = 'bitmap')::text, true);
  IF mode <> 'seq' THEN
    FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
      plan := plan || r."QUERY PLAN" || E'\n';
    END LOOP;
    IF NOT ((mode = 'index' AND amrwal_plan_uses_amrtree(plan, 'Index (?:Only )?Scan using (\S+) on'))
            OR (mode = 'bitmap' AND amrwal_plan_uses_amrtree(plan, 'Bitmap Index Scan on (\S+)'))) THEN
      RAISE EXCEPTION 'amrtree index not used for % scan: %', mode, plan;
    END IF;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  RETURN ids;
END $$;
-- count(*) of b && qb with plain index (or index-only) scans forced
CREATE OR REPLACE FUNCTION amrwal_count(tbl regclass, qb box)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  n bigint;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  PERFORM set_config('enable_indexscan', 'on', true);
  PERFORM set_config('enable_indexonlyscan', 'on', true);
  EXECUTE format('SELECT count(*) FROM %s WHERE b && %L::box', tbl, qb) INTO n;
  RETURN n;
END $$;
});
}

# amr_windows(qid, qb): $n windows spread over the Porto-like region, of four
# sizes from a few metres to two kilometres, plus $exact boxes copied from
# rows of $table (so that ~=, @> and <@ find exact matches).
sub amrwal_windows
{
	my ($node, $table, $n, $exact, $db) = @_;
	$db ||= 'postgres';
	$exact //= 10;
	$node->safe_psql(
		$db, qq{
CREATE TABLE IF NOT EXISTS amr_windows (qid int, qb box);
TRUNCATE amr_windows;
INSERT INTO amr_windows
SELECT g, box(point(x, y), point(x + w, y + 0.75 * w))
FROM (SELECT g, -8.688 + ((g * 37) % 101) / 100.0 * 0.12 AS x,
             41.098 + ((g * 53) % 89) / 88.0 * 0.085 AS y,
             (ARRAY[0.0005, 0.002, 0.006, 0.02])[1 + g % 4] AS w
      FROM generate_series(0, $n - 1) g) s;
INSERT INTO amr_windows
SELECT $n + row_number() OVER (ORDER BY id), b
FROM (SELECT id, b FROM $table WHERE b IS NOT NULL ORDER BY id LIMIT $exact) s;
});
}

# Run SQL without dying: returns the output, or "ERROR: <stderr>" when the
# query failed (so that is() shows the error).
sub amrwal_query
{
	my ($node, $sql, $db) = @_;
	$db ||= 'postgres';
	my ($out, $err) = ('', '');
	my $ret = eval {
		$node->psql($db, $sql, stdout => \$out, stderr => \$err,
			timeout => $PostgreSQL::Test::Utils::timeout_default);
	};
	return "ERROR: $@" unless defined $ret;
	return $out if $ret == 0;
	$err =~ s/\s+$//;
	return "ERROR: (psql exit $ret) $err";
}

sub _pairs
{
	my ($table, %o) = @_;
	my $every = $o{all_every} // 20;
	my $sel = join(', ', map { "'$_'" } @SELECTIVE);
	my $where = $every ? "o.op IN ($sel) OR w.qid % $every = 0" : 'true';
	$where = "($where) AND ($o{windows})" if $o{windows};
	return "amr_ops o, amr_windows w WHERE $where";
}

# Index results against a sequential scan on the same server: for every
# selective strategy on every window and every strategy on every
# all_every-th window (default 20; 1: every strategy everywhere), a plain
# index scan and a bitmap index scan each return exactly the ids a
# sequential scan returns; and for && a count(*) through the index (an
# index-only scan where the visibility map allows) equals the sequential
# scan's.  Returns (mismatches, description, seq digest, index digest):
# mismatches is 0 when all agree, the number of disagreeing (strategy,
# window) pairs, or the error text if a query failed; the digests are those
# amrwal_digest computes, from the same scans.
sub amrwal_parity
{
	my ($node, $table, %o) = @_;
	my $pairs = _pairs($table, %o);
	my $res = amrwal_query($node, qq{
WITH p AS MATERIALIZED (
  SELECT o.op, w.qid, w.qb,
         amrwal_ids('$table', o.op, w.qb, 'seq') AS s,
         amrwal_ids('$table', o.op, w.qb, 'index') AS i,
         amrwal_ids('$table', o.op, w.qb, 'bitmap') AS bm,
         CASE WHEN o.op = '&&' THEN amrwal_count('$table', w.qb) END AS c
  FROM $pairs),
q AS (SELECT *, (i <> s OR bm <> s OR c <> cardinality(s)) IS TRUE AS bad FROM p)
SELECT count(*) FILTER (WHERE bad), coalesce(sum(cardinality(s)), 0), count(*),
       md5(string_agg(op || ':' || qid || ':' || s::text, ',' ORDER BY op, qid)),
       md5(string_agg(op || ':' || qid || ':' || i::text, ',' ORDER BY op, qid)),
       coalesce(string_agg(op || ' on window ' || qid || ': seq ' || cardinality(s) || ', index '
                           || cardinality(i) || ', bitmap ' || cardinality(bm)
                           || coalesce(', count ' || c, ''), '; ')
                FILTER (WHERE bad), '')
FROM q}, $o{db});
	return ($res, '', $res, $res) if $res =~ /^ERROR/;
	my ($mismatch, $rows, $n, $seq, $idx, $detail) = split /\|/, $res, 6;
	if ($mismatch)
	{
		diag("$table: $detail");
		diag(amrwal_entry_faults($node, $table, $o{db}));
	}
	return ($mismatch, "$n (strategy, window) pairs, $rows rows", $seq, $idx);
}

# For a parity failure: the live entries of the table's amrtree indexes that
# do not describe the row their TID holds now (a visible row with another
# box: a stale entry whose TID was reused), and TIDs that more than one live
# entry names; with each entry's leaf, position and WAL position, and the
# server's WAL positions, so that a failure that does not repeat can still
# be traced to the change that left the entry behind.  (An entry of a dead
# row that VACUUM has not reached yet is normal and not listed.  The leaves
# are read one by one: with inserts running, a split between two reads
# lists the entries it moves twice, so duplicates mean something only with
# writes stopped, as amrwal_parity runs.)
sub amrwal_entry_faults
{
	my ($node, $table, $db) = @_;
	return amrwal_query($node, qq{
WITH i AS (SELECT c.oid AS idx FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
           JOIN pg_am a ON a.oid = c.relam
           WHERE x.indrelid = '$table'::regclass AND a.amname = 'amrtree'),
e AS (SELECT i.idx::regclass AS idx, l.* FROM i, amrtree_leaf_entries(i.idx) l WHERE NOT l.dead),
stale AS (SELECT 'stale' AS what, e.idx, e.leaf_id, e.entry, e.tid, e.key, e.insert_lsn, h.b AS heap_box
          FROM e JOIN $table h ON h.ctid = e.tid
          WHERE e.key IS NOT NULL AND NOT (h.b ~= e.key)),
dup AS (SELECT 'duplicate TID' AS what, e.idx, e.leaf_id, e.entry, e.tid, e.key, e.insert_lsn, NULL::box
        FROM e WHERE (e.idx, e.tid) IN (SELECT idx, tid FROM e GROUP BY 1, 2 HAVING count(*) > 1))
SELECT coalesce(string_agg(format('%s: %s leaf %s entry %s tid %s key %s insert_lsn %s heap %s',
                                  what, idx, leaf_id, entry, tid, key, insert_lsn, heap_box), E'\n'
                           ORDER BY what, tid, leaf_id),
                'no stale entry and no duplicate TID')
       || format(E'\nWAL insert %s, replayed %s, last checkpoint redo %s',
                 CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_insert_lsn() END,
                 pg_last_wal_replay_lsn(), (SELECT redo_lsn FROM pg_control_checkpoint()))
FROM (SELECT * FROM stale UNION ALL SELECT * FROM dup) f}, $db);
}

# A digest of what the queries return: mode 'index' (through the amrtree
# index, plain index scans), 'bitmap' or 'seq' (sequential scans), over the
# same (strategy, window) pairs as amrwal_parity.  Returns an md5 or
# "ERROR: ...".
sub amrwal_digest
{
	my ($node, $table, $mode, %o) = @_;
	my $pairs = _pairs($table, %o);
	return amrwal_query($node, qq{
SELECT md5(string_agg(o.op || ':' || w.qid || ':' || amrwal_ids('$table', o.op, w.qb, '$mode')::text,
                      ',' ORDER BY o.op, w.qid))
FROM $pairs}, $o{db});
}

# A digest of a table's rows (id, b), to show two servers hold the same heap.
sub amrwal_heap_digest
{
	my ($node, $table, $db) = @_;
	return amrwal_query($node, qq{
SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off;
SELECT md5(string_agg(id || ' ' || coalesce(b::text, 'null'), ',' ORDER BY id, b::text)) || ' ' || count(*) FROM $table}, $db);
}

# Two digests are the same and both are digests (two errors are not equal).
sub amrwal_same_digest
{
	my ($got, $expected, $name) = @_;
	my $ok = ok(defined $got && defined $expected && $got =~ /^[0-9a-f]{32}( \d+)?$/ && $got eq $expected, $name);
	diag("got: " . ($got // 'undef') . "\nexpected: " . ($expected // 'undef')) unless $ok;
	return $ok;
}

# 't', or the error text.
sub amrwal_check
{
	my ($node, $index, $db) = @_;
	return amrwal_query($node, "SELECT amrtree_check('$index')", $db);
}

# "leaves=N entries=M" of an index (the logical shape, whatever the tiers).
sub amrwal_shape
{
	my ($node, $index, $db) = @_;
	my $r = amrwal_query($node, "SELECT 'leaves=' || leaves || ' entries=' || entries FROM amrtree_index_stats('$index')", $db);
	return $r;
}

# EXPLAIN (COSTS OFF) of a query, as one line.
sub amrwal_explain
{
	my ($node, $sql, $db) = @_;
	my $r = amrwal_query($node, "EXPLAIN (COSTS OFF) $sql", $db);
	$r =~ s/\n/ | /g;
	return $r;
}

# Background load: pgbench runs of $seconds each, one after the other, until
# amrwal_stop_load.  A run that fails (the server went away, a client
# aborted) is logged and followed by the next after a short pause, so the
# load outlives crashes and restarts.  Options: scripts => { name => [sql,
# weight] }, clients (default 2), seconds per run (default 2), db.
sub amrwal_start_load
{
	my ($node, %o) = @_;
	my $clients = $o{clients} || 2;
	my $seconds = $o{seconds} || 2;
	my $db = $o{db} || 'postgres';
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my @files;
	for my $name (sort keys %{ $o{scripts} })
	{
		my ($sql, $weight) = @{ $o{scripts}{$name} };
		open my $fh, '>', "$dir/$name.sql" or die "$dir/$name.sql: $!";
		print $fh $sql;
		close $fh;
		push @files, "-f '$dir/$name.sql\@" . ($weight || 1) . "'";
	}
	my $host = $node->host;
	my $port = $node->port;
	my $script = qq{
while [ ! -e '$dir/stop' ]; do
  pgbench -n -c $clients -j $clients -T $seconds @files -h '$host' -p $port $db > '$dir/run.out' 2>&1
  rc=\$?
  echo "AMRWAL_RUN rc=\$rc"
  cat '$dir/run.out'
  [ \$rc -eq 0 ] || sleep 0.3
done
echo AMRWAL_DONE
};
	my $log = "$dir/load.out";
	my $h = IPC::Run::start([ 'sh', '-c', $script ], '<', \undef, '>', $log, '2>&1');
	return { h => $h, dir => $dir, log => $log, node => $node, started => time };
}

# Stop a load and summarise it: { runs, failed_runs, tx, failed_tx, errors
# => [ lines ], seconds, log }.
sub amrwal_stop_load
{
	my ($load) = @_;
	open my $fh, '>', "$load->{dir}/stop" or die;
	close $fh;
	$load->{h}->finish;
	my $log = slurp_file($load->{log});
	my %r = (runs => 0, failed_runs => 0, tx => 0, failed_tx => 0, errors => [],
		seconds => time - $load->{started}, log => $log);
	for my $line (split /\n/, $log)
	{
		if ($line =~ /^AMRWAL_RUN rc=(\d+)/)
		{
			$r{runs}++;
			$r{failed_runs}++ if $1 != 0;
		}
		$r{tx} += $1 if $line =~ /number of transactions actually processed: (\d+)/;
		$r{failed_tx} += $1 if $line =~ /number of failed transactions: (\d+)/;
		push @{ $r{errors} }, $line if $line =~ /ERROR|FATAL|PANIC|aborted|error:/;
	}
	return \%r;
}

# Assertions on a load that ran against a server that stayed up: every run
# succeeded and did work.
sub amrwal_load_ok
{
	my ($r, $what, $min_tx) = @_;
	$min_tx //= 50;
	ok($r->{runs} > 0 && $r->{failed_runs} == 0 && $r->{failed_tx} == 0,
		"$what: $r->{runs} pgbench runs, none failed")
	  or diag(join("\n", @{ $r->{errors} }[ 0 .. ($#{ $r->{errors} } < 20 ? $#{ $r->{errors} } : 19) ]));
	cmp_ok($r->{tx}, '>=', $min_tx, "$what: $r->{tx} transactions in " . sprintf('%.0f s', $r->{seconds}));
}

# The pids of a process's children.
sub amrwal_child_pids
{
	my ($pid) = @_;
	my @pids = grep { /^\d+$/ } map { s/\s+//gr } split /\n/, `ps -o pid= --ppid $pid`;
	return @pids;
}

# Wait until none of the given pids exists any more (up to the default
# timeout); true if they are all gone.
sub amrwal_wait_pids_gone
{
	my @pids = @_;
	my $deadline = time + $PostgreSQL::Test::Utils::timeout_default;
	while (time < $deadline)
	{
		return 1 unless grep { kill(0, $_) } @pids;
		usleep(50_000);
	}
	return 0;
}

# The pid of a server's postmaster if it is running (from postmaster.pid),
# else undef.
sub amrwal_pm_pid
{
	my ($node) = @_;
	open my $fh, '<', $node->data_dir . '/postmaster.pid' or return undef;
	my $pid = <$fh>;
	close $fh;
	return undef unless defined $pid && $pid =~ /^(\d+)/;
	$pid = $1;
	return kill(0, $pid) ? $pid : undef;
}

# The pid of a server's startup process (recovery), or undef.
sub amrwal_startup_pid
{
	my ($node) = @_;
	my $pm = amrwal_pm_pid($node) or return undef;
	for my $line (split /\n/, `ps -o pid=,args= --ppid $pm`)
	{
		return $1 if $line =~ /^\s*(\d+)\s+postgres: .*startup/;
	}
	return undef;
}

# Wait until $standby has replayed everything $primary has written so far,
# like wait_for_catchup, but give up at once (returning false, with the end
# of the standby's log as a diagnostic) if the standby stops running, e.g.
# because replay failed.
sub amrwal_catchup
{
	my ($primary, $standby, $timeout) = @_;
	my $target = $primary->lsn('write');
	my $name = $standby->name;
	my $deadline = time + ($timeout || $PostgreSQL::Test::Utils::timeout_default);
	while (time < $deadline)
	{
		my $r = amrwal_query($primary, qq{
SELECT '$target' <= replay_lsn AND state = 'streaming' FROM pg_stat_replication WHERE application_name = '$name'});
		return 1 if $r eq 't';
		if (!amrwal_pm_pid($standby))
		{
			my $log = slurp_file($standby->logfile);
			my @lines = split /\n/, $log;
			diag("$name is not running; the end of its log:\n"
				  . join("\n", @lines[ ($#lines > 30 ? $#lines - 30 : 0) .. $#lines ]));
			return 0;
		}
		usleep(100_000);
	}
	diag("$name did not replay up to $target in time");
	return 0;
}


1;
