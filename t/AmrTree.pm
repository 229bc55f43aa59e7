# Helpers shared by amrtree's TAP tests: nodes with amrtree preloaded and
# their pool on /dev/shm, Porto-like data, and parity checks against
# sequential scans.
package AmrTree;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(basename dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(amr_node amr_pool_path amr_forget_pool amr_standby_own_pool amr_load_porto amr_setup_parity
  amr_porto_windows amr_with_and_without_index amr_parity_mismatches amr_knn_mismatches amr_fingerprint amr_porto_gen amr_wait_for_server
  amr_wait_for_crash_restart amr_pool_header amr_setup_snapshot_checks amr_wait_for_index_use
  amr_check_index_agrees amr_lost_wal_primary amr_diag_extra_entries);

# Pool files are named after the run and the test file, so that files run
# side by side (scripts/test.sh runs two at a time) never share a pool even
# where their servers have the same names.
my $tag = ($ENV{AMR_POOL_TAG} || "amrtree-tap-$$-" . time()) . '-' . basename($0, '.pl');
my $src = $ENV{AMR_SRC} || dirname(__FILE__) . '/..';
my @pools;

sub amr_pool_path
{
	my ($name) = @_;
	return "/dev/shm/$tag-$name.pool";
}

# A pool path for a server amr_node did not make (a standby made from a
# backup, given a pool of its own): removed now, and when the test ends.
sub amr_forget_pool
{
	my ($path) = @_;
	unlink $path;
	push @pools, $path;
	return $path;
}

# A started primary that streams and lets no WAL reach the disk behind a
# transaction's back (the WAL writer sleeps, no flush-after), so that a kill
# of it loses the records of what an open transaction changed in the pool:
# amrtree and a table "filler" (for pushing WAL out) created.  $conf and
# $sql are added to its configuration and its setup.
sub amr_lost_wal_primary
{
	my (%opts) = @_;
	my $primary = amr_node('primary', init => { allows_streaming => 1 }, conf => q{
wal_writer_delay = 10s
wal_writer_flush_after = 0
wal_buffers = 4MB
autovacuum = off
amrtree.scan_interval = 1h
amrtree.ssd_size = 16MB
amrtree.budget_on_insert = strict
} . ($opts{conf} // ''));
	$primary->start;
	$primary->safe_psql('postgres',
		'CREATE EXTENSION amrtree; CREATE TABLE filler (x int, pad text); ' . ($opts{sql} // ''));
	return $primary;
}

# A streaming standby of $primary made from its backup $backup, with a pool
# (amr_pool_path($name)) and a slot file of its own, new and outside its
# data directory, instead of the backup's copies.  Not started.
sub amr_standby_own_pool
{
	my ($primary, $backup, $name) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init_from_backup($primary, $backup, has_streaming => 1);
	$node->append_conf('postgresql.conf',
		"amrtree.pmem_path = '" . amr_forget_pool(amr_pool_path($name)) . "'\n"
		  . "amrtree.ssd_path = '" . PostgreSQL::Test::Utils::tempdir() . "/$name.slots'\n");
	return $node;
}

# A node with amrtree preloaded.  Options: pool => path (default on
# /dev/shm), pmem_size, dram_size, preload => 0 to leave it out, conf =>
# extra postgresql.conf text, keep_pool => 1 to use an existing pool file,
# init => { options of PostgreSQL::Test::Cluster::init }.
sub amr_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	my $pool = exists $opt{pool} ? $opt{pool} : amr_pool_path($name);

	$node->init(%{ $opt{init} || {} });
	my $conf = '';
	$conf .= "shared_preload_libraries = 'amrtree'\n"
	  unless defined $opt{preload} && !$opt{preload};
	if (defined $pool)
	{
		unlink $pool unless $opt{keep_pool};
		push @pools, $pool;
		$conf .= "amrtree.pmem_path = '$pool'\n";
	}
	$conf .= "amrtree.pmem_size = " . ($opt{pmem_size} || '256MB') . "\n";
	$conf .= "amrtree.dram_size = $opt{dram_size}\n" if $opt{dram_size};
	$conf .= $opt{conf} if $opt{conf};
	$node->append_conf('postgresql.conf', $conf);
	return $node;
}

# Build bench/porto_gen once per test run; returns its path.
my $gen;

sub amr_porto_gen
{
	return $gen if $gen;
	my $dir = PostgreSQL::Test::Utils::tempdir();
	$gen = "$dir/porto_gen";
	system('cc', '-O2', '-o', $gen, "$src/bench/porto_gen.c", '-lm') == 0
	  or die "could not build porto_gen";
	return $gen;
}

# Load $rows Porto-like boxes into table $table (id int, b box, t float8).
sub amr_load_porto
{
	my ($node, $table, $rows, $seed, $db) = @_;
	$db ||= 'postgres';
	my $file = PostgreSQL::Test::Utils::tempdir() . "/porto-$rows-$seed.csv";
	system(amr_porto_gen() . " --rows $rows --seed $seed --format csv > $file") == 0
	  or die "porto_gen failed";
	$node->safe_psql($db,
		"CREATE TABLE IF NOT EXISTS $table (id int, b box, t float8);"
		  . "COPY $table (id, b, t) FROM '$file' WITH (FORMAT csv);");
	return $file;
}

# Functions for clients under load, each comparing in the caller's
# snapshot (call them in a REPEATABLE READ transaction) what the amrtree
# index on tbl(b) answers with one kind of scan forced with what a
# sequential scan answers, and raising an error when they differ (so that
# pgbench counts a failed transaction); tbl has a column id.
#   amr_check_window(tbl, w, op): b op w by plain, index-only and bitmap
#     scans (an error names the counts and key hashes, whether a visible
#     row has the key the index-only scan had too much or too little, and
#     what a second index-only scan returns: a transient race or not);
#   amr_check_nearest(tbl, p): the distances of the 10 rows nearest p.
sub amr_setup_snapshot_checks
{
	my ($node, $db) = @_;
	$node->safe_psql($db || 'postgres', q{
CREATE FUNCTION amr_check_window(tbl regclass, w box, op text) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
  rows_q text := format('SELECT count(*) || '':'' || coalesce(sum(hashtext(id::text)), 0) || '':'' || coalesce(sum(hashtext(b::text)), 0) FROM %s WHERE b %s %L::box', tbl, op, w);
  keys_q text := format('SELECT count(*) || '':'' || coalesce(sum(hashtext(b::text)), 0) FROM %s WHERE b %s %L::box', tbl, op, w);
  r_index text; r_bitmap text; r_only text; r_seq text; r_seq_keys text;
  r_only_again text; extra_key bigint; visible_with_key bigint;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  PERFORM set_config('enable_indexonlyscan', 'off', true);
  EXECUTE rows_q INTO r_index;
  PERFORM set_config('enable_indexonlyscan', 'on', true);
  EXECUTE keys_q INTO r_only;
  PERFORM set_config('enable_indexscan', 'off', true);
  PERFORM set_config('enable_indexonlyscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'on', true);
  EXECUTE rows_q INTO r_bitmap;
  PERFORM set_config('enable_bitmapscan', 'off', true);
  PERFORM set_config('enable_seqscan', 'on', true);
  EXECUTE rows_q INTO r_seq;
  EXECUTE keys_q INTO r_seq_keys;
  IF r_index <> r_seq OR r_bitmap <> r_seq OR r_only <> r_seq_keys THEN
    extra_key := split_part(r_only, ':', 2)::bigint - split_part(r_seq_keys, ':', 2)::bigint;
    EXECUTE format('SELECT count(*) FROM %s WHERE hashtext(b::text) = %s AND b %s %L::box',
                   tbl, extra_key, op, w) INTO visible_with_key;
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('enable_indexscan', 'on', true);
    PERFORM set_config('enable_indexonlyscan', 'on', true);
    EXECUTE keys_q INTO r_only_again;
    RAISE EXCEPTION 'index and sequential scans disagree on % b % %: index %, bitmap %, index-only %, sequential % (keys %); index-only again %, visible rows with key hash % (the index-only difference): %',
      tbl, op, w, r_index, r_bitmap, r_only, r_seq, r_seq_keys, r_only_again, extra_key, visible_with_key;
  END IF;
END $f$;
CREATE FUNCTION amr_check_nearest(tbl regclass, p point) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
  q text := format('SELECT string_agg(d::text, '','') FROM (SELECT b <-> %L::point AS d FROM %s ORDER BY b <-> %L::point LIMIT 10) s', p, tbl, p);
  r_index text; r_seq text;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  EXECUTE q INTO r_index;
  PERFORM set_config('enable_seqscan', 'on', true);
  PERFORM set_config('enable_indexscan', 'off', true);
  PERFORM set_config('enable_indexonlyscan', 'off', true);
  EXECUTE q INTO r_seq;
  IF r_index IS DISTINCT FROM r_seq THEN
    RAISE EXCEPTION 'KNN index and sequential scans disagree on % at %: index %, sequential %', tbl, p, r_index, r_seq;
  END IF;
END $f$;});
}

# Functions comparing index results with a sequential scan, for every
# strategy, on the windows in table amr_windows(qid int, qb box).
sub amr_setup_parity
{
	my ($node, $db) = @_;
	$db ||= 'postgres';
	$node->safe_psql(
		$db, q{
CREATE TABLE IF NOT EXISTS amr_ops (op text);
TRUNCATE amr_ops;
INSERT INTO amr_ops VALUES ('<<'), ('&<'), ('&&'), ('&>'), ('>>'), ('~='),
  ('@>'), ('<@'), ('&<|'), ('<<|'), ('|>>'), ('|&>');
CREATE OR REPLACE FUNCTION amr_ids(tbl regclass, op text, qb box, use_index bool)
RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id FROM %s WHERE b %s %L::box', tbl, op, qb);
  plan text := '';
  r record;
  ids int[];
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  IF use_index THEN
    FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
      plan := plan || r."QUERY PLAN";
    END LOOP;
    IF plan LIKE '%Seq Scan%' THEN
      RAISE EXCEPTION 'index not used: %', plan;
    END IF;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM (' || sql || ') s' INTO ids;
  RETURN ids;
END $$;
});
}

# amr_windows for Porto-like rows: 30 windows of seven sizes (about 40 to
# 300 metres) on a grid over the dense part of the region, and one
# (qid 100) around all of it.
sub amr_porto_windows
{
	my ($node, $db) = @_;
	$db ||= 'postgres';
	$node->safe_psql(
		$db, q{
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT g, box(point(x, y), point(x + w, y + w * 0.7))
FROM (SELECT g, -8.66 + (g % 10) * 0.009 AS x, 41.13 + (g / 10) * 0.008 AS y,
             0.0005 * (1 + g % 7) AS w FROM generate_series(0, 29) g) s;
INSERT INTO amr_windows VALUES (100, '((-8.7,41.0),(-8.5,41.2))');
});
}

# What $query returns with sequential scans off (through an index, if the
# planner has one) and with every index scan off: ($with, $without).
sub amr_with_and_without_index
{
	my ($node, $db, $query) = @_;
	my $with = $node->safe_psql($db, "SET enable_seqscan = off; $query");
	my $without = $node->safe_psql($db,
		"SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off; $query");
	return ($with, $without);
}

# Number of (strategy, window) pairs where the index disagrees with a
# sequential scan on $table; also returns the total number of rows matched.
sub amr_parity_mismatches
{
	my ($node, $table, $db) = @_;
	$db ||= 'postgres';
	my $res = $node->safe_psql(
		$db, qq{
SELECT count(*) FILTER (WHERE amr_ids('$table', op, qb, true) <> amr_ids('$table', op, qb, false)),
       sum(cardinality(amr_ids('$table', op, qb, false)))
FROM amr_ops, amr_windows});
	my ($mismatch, $rows) = split /\|/, $res;
	return ($mismatch, $rows);
}

# Number of query points (the centres of the first $npoints windows) where
# "ORDER BY b <-> point LIMIT $k" through the index (which must order by
# it) disagrees with a sequential scan and sort: the distances in order,
# and the ids of the rows closer than the last one (rows tied with the last
# may differ between two correct answers).
sub amr_knn_mismatches
{
	my ($node, $table, $npoints, $k, $db) = @_;
	$db ||= 'postgres';
	$node->safe_psql(
		$db, q{
CREATE OR REPLACE FUNCTION amr_knn(tbl regclass, q point, k int, use_index bool)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  sql text := format('SELECT id, b <-> %L::point AS d FROM %s ORDER BY b <-> %L::point LIMIT %s',
                     q, tbl, q, k);
  plan text := '';
  r record;
  result text;
BEGIN
  PERFORM set_config('enable_seqscan', CASE WHEN use_index THEN 'off' ELSE 'on' END, true);
  PERFORM set_config('enable_indexscan', CASE WHEN use_index THEN 'on' ELSE 'off' END, true);
  PERFORM set_config('enable_bitmapscan', 'off', true);
  IF use_index THEN
    FOR r IN EXECUTE 'EXPLAIN (COSTS OFF) ' || sql LOOP
      plan := plan || r."QUERY PLAN";
    END LOOP;
    IF plan NOT LIKE '%Order By: (b <->%' THEN
      RAISE EXCEPTION 'index does not order: %', plan;
    END IF;
  END IF;
  EXECUTE 'SELECT coalesce(array_agg(d ORDER BY n), ''{}'')::text || '' '' || ' ||
          'coalesce(array_agg(id ORDER BY d, id) FILTER (WHERE d < last), ''{}'')::text ' ||
          'FROM (SELECT id, d, n, last_value(d) OVER (ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING ' ||
          'AND UNBOUNDED FOLLOWING) last FROM (SELECT id, d, row_number() OVER () n FROM (' ||
          sql || ') s) s) s' INTO result;
  RETURN result;
END $$;
});
	return $node->safe_psql(
		$db, qq{
SELECT count(*) FILTER (WHERE amr_knn('$table', center(qb), $k, true) <> amr_knn('$table', center(qb), $k, false))
FROM (SELECT qb FROM amr_windows LIMIT $npoints) w});
}

# Once the server answers again (after a crash or a restart): amrtree_check
# on $index passes, every strategy of amr_setup_parity's windows returns
# through the index what a sequential scan returns on $table, and KNN
# ($k nearest to $npoints window centres) equals a sort.  Three tests,
# named after $what.
sub amr_check_index_agrees
{
	my ($node, $what, $table, $index, $npoints, $k) = @_;
	amr_wait_for_server($node) or die "server did not come back";
	is($node->safe_psql('postgres', "SELECT amrtree_check('$index')"), 't', "$what: amrtree_check");
	my ($mismatch, $rows) = amr_parity_mismatches($node, $table);
	is($mismatch, 0, "$what: 12 strategies x 40 windows equal a sequential scan ($rows rows)");
	is(amr_knn_mismatches($node, $table, $npoints, $k), 0, "$what: KNN equals a sort");
	return;
}

# After a failed "entries equal the rows" check: print the live and
# distinct-TID counts of $index, its live entries whose TID shows no row of
# $table (with the heap item's line-pointer flags / xmin / xmax: 3 is a dead
# line pointer VACUUM has not yet taken back, "none" a TID past the heap's
# end), and its live entries that share a TID.
sub amr_diag_extra_entries
{
	my ($node, $table, $index) = @_;
	diag($node->safe_psql('postgres', qq{
CREATE EXTENSION IF NOT EXISTS pageinspect;
SELECT 'live entries ' || count(*) || ', distinct tids ' || count(DISTINCT tid)
  FROM amrtree_leaf_entries('$index') WHERE NOT dead;
SELECT 'no visible row: leaf ' || e.leaf_id || ' entry ' || e.entry || ' tid ' || e.tid
       || ' key ' || e.key || ' lsn ' || e.insert_lsn || ' heap item ' ||
       CASE WHEN (e.tid::text::point)[0] >= pg_relation_size('$table') / current_setting('block_size')::int
            THEN 'none'
            ELSE coalesce((SELECT lp_flags || '/' || coalesce(t_xmin::text, '-') || '/' || coalesce(t_xmax::text, '-')
                             FROM heap_page_items(get_raw_page('$table', (e.tid::text::point)[0]::int))
                            WHERE lp = (e.tid::text::point)[1]), 'none') END
  FROM amrtree_leaf_entries('$index') e
 WHERE NOT e.dead AND NOT EXISTS (SELECT 1 FROM $table r WHERE r.ctid = e.tid) LIMIT 20;
SELECT 'shared row: leaf ' || leaf_id || ' entry ' || entry || ' tid ' || tid || ' lsn ' || insert_lsn
  FROM amrtree_leaf_entries('$index')
 WHERE NOT dead AND tid IN (SELECT tid FROM amrtree_leaf_entries('$index')
                             WHERE NOT dead GROUP BY tid HAVING count(*) > 1) LIMIT 20;}));
	return;
}

# The header of the pool file $path, as src/core/amr_format.h lays it out
# (AmrPoolHeader): its byte offset in the file and its fields by name.
my @pool_header_fields = (
	[ magic => 'Q<' ], [ format_version => 'L<' ], [ slot_size => 'L<' ],
	[ system_identifier => 'Q<' ], [ pool_id => 'Q<' ], [ created_at => 'Q<' ],
	[ pmem_nslots => 'Q<' ], [ lt_capacity => 'Q<' ], [ max_trees => 'L<' ],
	[ reserved0 => 'L<' ], [ slots_offset => 'Q<' ], [ lt_offset => 'Q<' ],
	[ trees_offset => 'Q<' ], [ ssd_file_id => 'Q<' ], [ prune_horizon => 'Q<' ],
	[ history_reset => 'Q<' ], [ writeback => 'Q<' ], [ fenced_redo => 'Q<' ],
	[ boot => 'Q<' ], [ initialized => 'Q<' ], [ wal_extent_tli => 'L<' ],
	[ check_tli => 'L<' ], [ wal_extent => 'Q<' ], [ check_extent => 'Q<' ]);

sub amr_pool_header
{
	my ($path) = @_;
	open(my $fh, '<:raw', $path) or die "$path: $!";
	my $data;
	read($fh, $data, 64 << 20);
	close $fh;
	my $at = index($data, 'AMRTREE1');
	die "pool header not found in $path" if $at < 0;
	my $format = join(' ', map { $_->[1] } @pool_header_fields);
	my %header;
	@header{ map { $_->[0] } @pool_header_fields } = unpack($format, substr($data, $at));
	return ($at, \%header);
}

# A digest of everything every strategy returns on every window (via the
# index), to compare before and after a restart.
sub amr_fingerprint
{
	my ($node, $table, $db) = @_;
	$db ||= 'postgres';
	return $node->safe_psql(
		$db, qq{
SELECT md5(string_agg(op || ':' || qid || ':' || amr_ids('$table', op, qb, true)::text, ',' ORDER BY op, qid))
FROM amr_ops, amr_windows});
}

# After a process of $node crashed (or was killed) at a moment when the log
# had $log_at bytes: wait until the postmaster has begun its crash-restart
# cycle -- until then a query may still find the old server up, and the
# next one meet the restart -- and then until it accepts queries again.
sub amr_wait_for_crash_restart
{
	my ($node, $log_at, $db) = @_;
	$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_at);
	return amr_wait_for_server($node, $db);
}

# Wait until the server accepts queries again after a crash restart.
# poll_query_until() dies when psql exits before reading its input ("Broken
# pipe" from IPC::Run), which a connection refused during the restart makes
# it do; retry through that instead.
sub amr_wait_for_server
{
	my ($node, $db) = @_;
	$db ||= 'postgres';
	my $deadline = time() + $PostgreSQL::Test::Utils::timeout_default;
	while (time() < $deadline)
	{
		my $ok = eval {
			my ($ret, $out) = $node->psql($db, 'SELECT 1');
			$ret == 0 && $out eq '1';
		};
		return 1 if $ok;
		select(undef, undef, undef, 0.1);
	}
	return 0;
}

# Wait up to $secs seconds until the planner, with sequential scans off,
# uses the index $index for $query in $db again (after a rebuild in the
# background); whether it did.
sub amr_wait_for_index_use
{
	my ($node, $db, $query, $index, $secs) = @_;
	for (1 .. $secs * 5)
	{
		my ($ret, $plan) = $node->psql($db, "SET enable_seqscan = off; EXPLAIN (COSTS OFF) $query");
		return 1 if $ret == 0 && $plan =~ /\Q$index\E/;
		select(undef, undef, undef, 0.2);
	}
	return 0;
}

# The pools, and any copy of one the server set aside as unusable
END
{
	unlink $_, glob("$_.unusable-*") for @pools;
}

1;
