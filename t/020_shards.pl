# Scaling out with PostgreSQL's own tools: a coordinator (postgres_fdw, no
# amrtree) with a table partitioned into foreign partitions on two shard
# servers, each with amrtree preloaded and its own amrtree index.  Rows
# inserted through the coordinator land on the right shard; for every box
# operator on a few hundred windows the coordinator returns exactly what a
# single server with one amrtree index over all the rows returns; the
# operators are shipped to the shards, where amrtree answers them; and a
# query that adds a predicate on the partition key reaches one shard only.
# A hash-partitioned variant does the same with the rows spread by id.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $rows = 20000;
my $seed = 20;
my @ops = ('<<', '&<', '&&', '&>', '>>', '~=', '@>', '<@', '&<|', '<<|', '|>>', '|&>');

# Wait up to $secs for $sql to return 't' (poll_query_until would wait the
# full default timeout of minutes before reporting a failure).
sub wait_true
{
	my ($node, $sql, $secs) = @_;
	my $deadline = time() + ($secs || 30);
	while (time() < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		select(undef, undef, undef, 0.2);
	}
	return 0;
}

# The reference: one server, all rows, one amrtree index.
my $single = amr_node('single');
$single->start;
$single->safe_psql('postgres', 'CREATE EXTENSION amrtree');
my $csv = amr_load_porto($single, 'trips', $rows, $seed);
$single->safe_psql('postgres', 'CREATE INDEX trips_b ON trips USING amrtree (b); ANALYZE trips');

# Two shards with amrtree preloaded.  They hold plain tables with the same
# columns as the reference; the partitioning exists only on the coordinator.
my @shards;
for my $i (1, 2)
{
	my $shard = amr_node("shard$i");
	$shard->start;
	$shard->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE trips (id int, b box, t float8);
CREATE TABLE trips_h (id int, b box, t float8);});
	push @shards, $shard;
}

# The coordinator: postgres_fdw only.  async_capable lets an Append send
# its query to both shards before it waits for either (PostgreSQL 14+);
# a large fetch_size keeps the wide operators (<<, >>, ...) from needing a
# round trip per 100 rows.
my $coord = PostgreSQL::Test::Cluster->new('coordinator');
$coord->init;
$coord->start;
$coord->safe_psql('postgres', 'CREATE EXTENSION postgres_fdw');
for my $i (1, 2)
{
	my $shard = $shards[ $i - 1 ];
	my ($host, $port) = ($shard->host, $shard->port);
	$coord->safe_psql('postgres', qq{
CREATE SERVER shard$i FOREIGN DATA WRAPPER postgres_fdw
  OPTIONS (host '$host', port '$port', dbname 'postgres', fetch_size '1000',
           batch_size '500', async_capable 'true');
CREATE USER MAPPING FOR CURRENT_USER SERVER shard$i;});
}

# The rows, staged in a local table on the coordinator to be inserted
# through the partitioned table (the same file as the reference's).
$coord->safe_psql('postgres', qq{
CREATE TABLE staging (id int, b box, t float8);
COPY staging FROM '$csv' WITH (FORMAT csv);});

# Partition key: the box's west edge, (b[1])[0] (b[1] is a box's lower-left
# corner).  A box is stored on exactly one shard, and, unlike the centre,
# the west edge is bounded by the query window for the operators that
# bound a box from the east: b && w, b << w, b &< w, b <@ w, b ~= w and
# b @> w all imply (b[1])[0] <= w's east edge (+ the operators' 1e-6 fuzz).
# A query that adds that implied predicate is pruned to the shards whose
# range can hold a match, without losing a row.  A key on the centre could
# not be pruned exactly: a long box (the trip-joining boxes in this data)
# overlaps windows far from its centre.  An expression key needs no extra
# column that the application must keep in step with b; the shards do
# not see it at all.  The split is the median west edge, for two shards of
# equal size.
my $split = $coord->safe_psql('postgres',
	'SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY (b[1])[0]) FROM staging');

# Each shard's table checks its partition's bounds.  PostgreSQL does not
# check a foreign partition's bounds and does not move rows out of one: an
# UPDATE through the coordinator that moves a box's west edge across the
# split would leave the row on the old shard, where a query with the
# pruning predicate misses it.  With the CHECK, the shard refuses it.
$shards[0]->safe_psql('postgres', "ALTER TABLE trips ADD CONSTRAINT trips_range CHECK ((b[1])[0] < $split)");
$shards[1]->safe_psql('postgres', "ALTER TABLE trips ADD CONSTRAINT trips_range CHECK ((b[1])[0] >= $split)");
$coord->safe_psql('postgres', qq{
CREATE TABLE trips (id int, b box, t float8) PARTITION BY RANGE (((b[1])[0]));
CREATE FOREIGN TABLE trips_west PARTITION OF trips FOR VALUES FROM (MINVALUE) TO ($split)
  SERVER shard1 OPTIONS (table_name 'trips');
CREATE FOREIGN TABLE trips_east PARTITION OF trips FOR VALUES FROM ($split) TO (MAXVALUE)
  SERVER shard2 OPTIONS (table_name 'trips');
INSERT INTO trips SELECT * FROM staging;});

# Routing: each shard holds exactly the rows of its key range.
my ($west_rows, $east_rows) = split /\|/, $coord->safe_psql('postgres', qq{
SELECT count(*) FILTER (WHERE (b[1])[0] < $split), count(*) FILTER (WHERE (b[1])[0] >= $split)
FROM staging});
cmp_ok($west_rows, '>', 0, "the split leaves rows west of it ($west_rows)");
cmp_ok($east_rows, '>', 0, "and east of it ($east_rows)");
is($shards[0]->safe_psql('postgres', qq{SELECT count(*), count(*) FILTER (WHERE (b[1])[0] >= $split) FROM trips}),
	"$west_rows|0", 'INSERT through the coordinator put every west row, and only those, on shard 1');
is($shards[1]->safe_psql('postgres', qq{SELECT count(*), count(*) FILTER (WHERE (b[1])[0] < $split) FROM trips}),
	"$east_rows|0", '... and every east row on shard 2');
my $digest = q{SELECT md5(string_agg(id || ':' || b::text || ':' || t::text, ',' ORDER BY id)) FROM trips};
is($coord->safe_psql('postgres', $digest), $single->safe_psql('postgres', $digest),
	'the coordinator reads back exactly the rows of the reference server');

# Indexes are created on the shards, not through the coordinator (a
# foreign table has no indexes of its own).
for my $shard (@shards)
{
	$shard->safe_psql('postgres', 'CREATE INDEX trips_b ON trips USING amrtree (b); ANALYZE trips');
}
$coord->safe_psql('postgres', 'ANALYZE trips');

# Query windows, made on the coordinator from the data and copied to the
# reference: windows of several sizes around data boxes, data boxes
# themselves (so that ~=, @> and <@ find rows), windows across the split,
# and a few large ones.
$coord->safe_psql('postgres', qq{
SELECT setseed(0.2);
CREATE TABLE amr_windows (qid int, qb box);
INSERT INTO amr_windows
SELECT row_number() OVER (), box(point((center(b))[0] - w, (center(b))[1] - w * 0.8),
                                 point((center(b))[0] + w, (center(b))[1] + w * 0.8))
FROM (SELECT b, (0.0002 * power(2, floor(random() * 7)))::float8 AS w
      FROM staging ORDER BY random() LIMIT 180) s;
INSERT INTO amr_windows SELECT 1000 + row_number() OVER (), b
FROM (SELECT b FROM staging ORDER BY random() LIMIT 40) s;
INSERT INTO amr_windows
SELECT 2000 + g, box(point($split - 0.001 * g, 41.14 + 0.001 * g), point($split + 0.0007 * g, 41.15 + 0.001 * g))
FROM generate_series(1, 20) g;
INSERT INTO amr_windows VALUES (3001, '((-8.7,41.0),(-8.5,41.2))'), (3002, '((-8.65,41.1),(-8.6,41.17))'),
  (3003, '((-8.62,41.14),(-8.61,41.15))');});
my $windows = $coord->safe_psql('postgres',
	q{SELECT string_agg(format('(%s, %L)', qid, qb), ',') FROM amr_windows});
$single->safe_psql('postgres', "CREATE TABLE amr_windows (qid int, qb box); INSERT INTO amr_windows VALUES $windows");
my $nwin = $coord->safe_psql('postgres', 'SELECT count(*) FROM amr_windows');

# The reference is itself checked: its index agrees with a sequential scan.
amr_setup_parity($single);
my ($mismatch, $matched) = amr_parity_mismatches($single, 'trips');
is($mismatch, 0, "reference: the index agrees with a sequential scan ($matched rows matched)");

# The operators are shipped: for each, both foreign scans carry it in their
# remote WHERE clause and nothing is filtered on the coordinator.
for my $op (@ops)
{
	my $plan = $coord->safe_psql('postgres',
		qq{EXPLAIN (VERBOSE, COSTS OFF) SELECT id FROM trips WHERE b $op '((-8.62,41.14),(-8.61,41.15))'::box});
	my $shipped = () = $plan =~ /Remote SQL: SELECT id FROM public\.trips WHERE \(\(b \Q$op\E '\(-8\.61,41\.15\),\(-8\.62,41\.14\)'(?:::box)?\)\)/g;
	ok($shipped == 2 && $plan !~ /Filter:/, "operator $op is pushed down to both shards")
	  or diag($plan);
}

# Index and sequential scans of a table on each shard, once every session
# that postgres_fdw had opened there has ended: a backend flushes its
# statistics when it exits, before it leaves pg_stat_activity.  (Sessions
# of the coordinator end when it does; postgres_fdw_disconnect_all() ends
# those of the current one.)  The tables have no index but amrtree's.
sub shard_scans
{
	my ($table) = @_;
	my @res;
	for my $shard (@shards)
	{
		wait_true($shard, q{SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name = 'postgres_fdw'})
		  or die 'postgres_fdw sessions on ' . $shard->name . ' did not end';
		push @res, [ split /\|/, $shard->safe_psql('postgres',
			qq{SELECT coalesce(idx_scan, 0), coalesce(seq_scan, 0) FROM pg_stat_user_tables WHERE relname = '$table'}) ];
	}
	return @res;
}

# Scans on each shard since @$before: [index scans, sequential scans].
sub shard_scans_since
{
	my ($table, $before) = @_;
	my @now = shard_scans($table);
	return map { [ $now[$_][0] - $before->[$_][0], $now[$_][1] - $before->[$_][1] ] } (0, 1);
}

# With the planner left alone, a small window is an amrtree index scan on
# each shard.
my @before = shard_scans('trips');
my $small = q{box '((-8.612,41.146),(-8.608,41.149))'};
is($coord->safe_psql('postgres', "SELECT count(*) FROM trips WHERE b && $small; SELECT postgres_fdw_disconnect_all()"),
	$single->safe_psql('postgres', "SELECT count(*) FROM trips WHERE b && $small") . "\nt",
	'a small window through the coordinator counts what the reference counts');
my @d = shard_scans_since('trips', \@before);
ok($d[0][0] == 1 && $d[0][1] == 0 && $d[1][0] == 1 && $d[1][1] == 0,
	'each shard answered it with an index scan, not a sequential scan')
  or diag("shard deltas (idx, seq): @{$d[0]} / @{$d[1]}");

# Every operator on every window: the coordinator returns the reference's
# rows.  Sequential scans are disabled on the shards (for the sessions
# postgres_fdw opens there from now on) so that amrtree answers every
# shipped query, also those whose windows cover most of the table.
for my $shard (@shards)
{
	$shard->safe_psql('postgres', 'ALTER DATABASE postgres SET enable_seqscan = off');
}
my $ids_fn = q{
CREATE FUNCTION ids(tbl regclass, op text, qb box) RETURNS int[] LANGUAGE plpgsql AS $$
DECLARE ids int[];
BEGIN
  EXECUTE format('SELECT coalesce(array_agg(id ORDER BY id), ''{}'') FROM %s WHERE b %s %L::box', tbl, op, qb)
    INTO ids;
  RETURN ids;
END $$;};
$coord->safe_psql('postgres', $ids_fn);
$single->safe_psql('postgres', $ids_fn);

# Per operator: the number of rows matched over all windows and a digest of
# the sorted ids per window.
sub per_op
{
	my ($node, $table, $where) = @_;
	$where ||= 'true';
	my $oplist = join(', ', map { "'$_'" } @ops);
	my %res;
	for my $line (split /\n/, $node->safe_psql('postgres', qq{
SET enable_seqscan = off;
SELECT sum(cardinality(r)), md5(string_agg(qid || ':' || r::text, ',' ORDER BY qid)), op
FROM (SELECT op, qid, ids('$table', op, qb) AS r FROM unnest(ARRAY[$oplist]) op, amr_windows WHERE $where) s
GROUP BY op}))
	{
		# the operator last: some contain psql's column separator
		my ($n, $md5, $op) = split /\|/, $line, 3;
		$res{$op} = [ $n, $md5 ];
	}
	return \%res;
}

@before = shard_scans('trips');
my $t0 = time();
my $ref = per_op($single, 'trips');
my $got = per_op($coord, 'trips');
note(sprintf('%d windows x 12 operators: %d s', $nwin, time() - $t0));
$coord->safe_psql('postgres', 'SELECT postgres_fdw_disconnect_all()');
for my $op (@ops)
{
	is("@{ $got->{$op} || [] }", "@{ $ref->{$op} }",
		"operator $op on $nwin windows: the coordinator returns the reference's rows ($ref->{$op}[0])");
}
ok((grep { $ref->{$_}[0] > 0 } @ops) == 12, 'every operator matched rows on some window');
@d = shard_scans_since('trips', \@before);
ok($d[0][0] >= 12 * $nwin && $d[0][1] == 0 && $d[1][0] >= 12 * $nwin && $d[1][1] == 0,
	'every shipped query was an amrtree index scan on both shards')
  or diag("shard deltas (idx, seq): @{$d[0]} / @{$d[1]}; expected idx >= " . 12 * $nwin);

# Pruning.  A window west of the split, with the predicate that && implies
# on the key (its east edge plus a margin above the operators' 1e-6 fuzz),
# is planned on shard 1 alone and opens no connection to shard 2.
my ($wx0, $wx1) = ($split - 0.02, $split - 0.012);
my $west_q = qq{SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM trips
WHERE b && box(point($wx0, 41.14), point($wx1, 41.16))};
my $plan = $coord->safe_psql('postgres', "EXPLAIN (COSTS OFF) $west_q AND (b[1])[0] <= $wx1 + 1e-5");
ok($plan =~ /Foreign Scan on trips_west/ && $plan !~ /trips_east/, 'a window west of the split is planned on shard 1 only')
  or diag($plan);
my $west_ref = $single->safe_psql('postgres', $west_q);
isnt($west_ref, '{}', 'the west window matches rows on the reference');
my ($west_got, $conns) = split /\n/, $coord->safe_psql('postgres',
	"$west_q AND (b[1])[0] <= $wx1 + 1e-5; SELECT string_agg(server_name, ',' ORDER BY server_name) FROM postgres_fdw_get_connections()");
is($west_got, $west_ref, 'and returns the reference\'s rows');
is($conns, 'shard1', 'only shard 1 was connected to');
# >> bounds the west edge from below: east of the split, shard 2 alone.
my ($ex0, $ex1) = ($split + 0.001, $split + 0.004);
my $east_q = qq{SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM trips
WHERE b >> box(point($ex0, 41.14), point($ex1, 41.16))};
$plan = $coord->safe_psql('postgres', "EXPLAIN (COSTS OFF) $east_q AND (b[1])[0] > $ex1");
ok($plan =~ /Foreign Scan on trips_east/ && $plan !~ /trips_west/, 'b >> w with w east of the split is planned on shard 2 only')
  or diag($plan);
my $east_ref = $single->safe_psql('postgres', $east_q);
isnt($east_ref, '{}', 'the east query matches rows on the reference');
is($coord->safe_psql('postgres', "$east_q AND (b[1])[0] > $ex1"), $east_ref, 'and returns the reference\'s rows');

# A box moved across the split by an UPDATE through the coordinator.
my $moved = $shards[0]->safe_psql('postgres', 'SELECT min(id) FROM trips');
my ($ret, $out, $err) = $coord->psql('postgres',
	"UPDATE trips SET b = box(point($split + 0.01, 41.15), point($split + 0.02, 41.16)) WHERE id = $moved");
like($err, qr/violates check constraint "trips_range"/,
	'an UPDATE that would leave a box on the wrong shard is refused by the shard');
is($shards[0]->safe_psql('postgres', "SELECT (b[1])[0] < $split FROM trips WHERE id = $moved"), 't',
	'... and the row is unchanged');

# Hash partitioning by id: every query reaches both shards; a lookup by id
# reaches one.  Without async_capable here, so that the synchronous
# Append path is covered too.
$coord->safe_psql('postgres', q{
ALTER SERVER shard1 OPTIONS (SET async_capable 'false');
ALTER SERVER shard2 OPTIONS (SET async_capable 'false');
CREATE TABLE trips_h (id int, b box, t float8) PARTITION BY HASH (id);
CREATE FOREIGN TABLE trips_h0 PARTITION OF trips_h FOR VALUES WITH (MODULUS 2, REMAINDER 0)
  SERVER shard1 OPTIONS (table_name 'trips_h');
CREATE FOREIGN TABLE trips_h1 PARTITION OF trips_h FOR VALUES WITH (MODULUS 2, REMAINDER 1)
  SERVER shard2 OPTIONS (table_name 'trips_h');
INSERT INTO trips_h SELECT * FROM staging;});
my ($h0, $h1) = map { $_->safe_psql('postgres', 'SELECT count(*) FROM trips_h') } @shards;
ok($h0 > 0 && $h1 > 0 && $h0 + $h1 == $rows, "hash partitioning spread the rows over both shards ($h0 + $h1)");
for my $shard (@shards)
{
	$shard->safe_psql('postgres', 'CREATE INDEX trips_h_b ON trips_h USING amrtree (b); ANALYZE trips_h');
}
@before = shard_scans('trips_h');
my $hwin = 'qid % 4 = 0';
my $nh = $coord->safe_psql('postgres', "SELECT count(*) FROM amr_windows WHERE $hwin");
$ref = per_op($single, 'trips', $hwin);
$got = per_op($coord, 'trips_h', $hwin);
$coord->safe_psql('postgres', 'SELECT postgres_fdw_disconnect_all()');
is(join(';', map { "$_=@{ $got->{$_} || [] }" } @ops), join(';', map { "$_=@{ $ref->{$_} }" } @ops),
	"hash partitions: every operator on $nh windows returns the reference's rows");
@d = shard_scans_since('trips_h', \@before);
ok($d[0][0] >= 12 * $nh && $d[0][1] == 0 && $d[1][0] >= 12 * $nh && $d[1][1] == 0,
	'... each through the amrtree index of both shards')
  or diag("shard deltas (idx, seq): @{$d[0]} / @{$d[1]}");
$plan = $coord->safe_psql('postgres', 'EXPLAIN (COSTS OFF) SELECT b FROM trips_h WHERE id = 4242');
is(scalar(() = $plan =~ /Foreign Scan/g), 1, 'a lookup by id is planned on one shard') or diag($plan);
is($coord->safe_psql('postgres', 'SELECT b FROM trips_h WHERE id = 4242'),
	$single->safe_psql('postgres', 'SELECT b FROM trips WHERE id = 4242'), 'and finds the row');

$coord->stop;
$_->stop for @shards;
$single->stop;
done_testing();
