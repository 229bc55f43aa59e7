# After a clean restart, a crash restart (kill -9 of a backend) and an
# immediate shutdown, the inner nodes are rebuilt from the Leaf Table before
# first use and every query returns exactly what it returned before.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

my $node = amr_node('restart', conf => "restart_after_crash = on\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION amrtree');

# bulk-built part, then one-by-one inserts (splits), deletes and a vacuum
amr_load_porto($node, 'trips', 40000, 7);
$node->safe_psql('postgres', q{
CREATE INDEX trips_b ON trips USING amrtree (b);
INSERT INTO trips SELECT id + 100000, box(point((b[0])[0] + 0.0003, (b[0])[1]), point((b[1])[0] + 0.0003, (b[1])[1])), t
  FROM trips WHERE id % 4 = 0;
INSERT INTO trips SELECT 200000 + i, NULL, 0 FROM generate_series(1, 50) i;
DELETE FROM trips WHERE id % 7 = 0;
VACUUM ANALYZE trips;
});
amr_setup_parity($node);
amr_porto_windows($node);
$node->safe_psql('postgres', q{INSERT INTO amr_windows VALUES (101, '((-8.62,41.14),(-8.61,41.15))')});

my ($mismatch, $rows) = amr_parity_mismatches($node, 'trips');
is($mismatch, 0, 'index agrees with a sequential scan before restart');
cmp_ok($rows, '>', 1000, "windows match real rows ($rows)");
my $before = amr_fingerprint($node, 'trips');
my $count = $node->safe_psql('postgres', 'SELECT count(*) FROM trips');

sub same_after
{
	my ($what) = @_;
	is(amr_fingerprint($node, 'trips'), $before, "every strategy returns the same rows after $what");
	is($node->safe_psql('postgres', 'SELECT amrtree_check(\'trips_b\')'), 't', "amrtree_check after $what");
	my ($m) = amr_parity_mismatches($node, 'trips');
	is($m, 0, "index agrees with a sequential scan after $what");
	is($node->safe_psql('postgres', 'SET enable_seqscan = off; SELECT count(*) FROM trips'),
		$count, "full index-only scan counts every row after $what");
}

$node->restart;
same_after('a clean restart');
like($node->safe_psql('postgres', 'SELECT rebuilds FROM amrtree_pool_stats()'), qr/^1$/,
	'the inner nodes were rebuilt once');

# crash of one backend: the postmaster reinitialises shared memory
my $bg = $node->background_psql('postgres');
my $pid = $bg->query_safe('SELECT pg_backend_pid()');
my $log_at = -s $node->logfile;
kill 'KILL', $pid;
$bg->quit;
amr_wait_for_crash_restart($node, $log_at) or die 'server did not come back';
same_after('a backend crash');

$node->stop('immediate');
$node->start;
same_after('an immediate shutdown');

# and the rebuilt tree keeps working for writes
$node->safe_psql('postgres', q{
INSERT INTO trips SELECT 300000 + i, box(point(-8.61 + i * 1e-5, 41.145), point(-8.61 + i * 1e-5 + 1e-4, 41.146)), 0
FROM generate_series(1, 5000) i;
});
is($node->safe_psql('postgres', 'SELECT amrtree_check(\'trips_b\')'), 't', 'inserts after the rebuild keep the tree valid');
($mismatch) = amr_parity_mismatches($node, 'trips');
is($mismatch, 0, 'and queries agree with a sequential scan');

$node->stop;
done_testing();
