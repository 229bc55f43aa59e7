# Data checksums on a cluster with amrtree indexes: after builds, splits,
# tier moves and write-back, pg_checksums and pg_basebackup (which verifies
# checksums as it copies) find no bad page; pg_checksums --enable on an
# existing cluster leaves the indexes working; and a metapage whose checksum
# fails is not taken for another tree's by the start that reconciles the
# pool: the tree stays, PostgreSQL reports the damage, and REINDEX mends it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;

# The pool and the slot file in the data directory (the defaults), so that
# pg_basebackup copies them.
my $node = amr_node('cksum', pool => undef, pmem_size => '64MB',
	init => { extra => ['--data-checksums'], allows_streaming => 1 }, conf => q{
autovacuum = off
amrtree.ssd_size = 64MB
amrtree.scan_interval = 100ms
});
$node->start;
$node->safe_psql('postgres', q{
CREATE EXTENSION amrtree;
CREATE TABLE t (id int PRIMARY KEY, b box, p point);
INSERT INTO t SELECT g, box(point(x, y), point(x + 0.002, y + 0.002)), point(x, y)
FROM (SELECT g, (g * 7919 % 10007) / 10007.0 AS x, (g * 104729 % 10009) / 10009.0 AS y
      FROM generate_series(1, 20000) g) s;
CREATE INDEX t_b ON t USING amrtree (b);
CREATE INDEX t_p ON t USING amrtree (p);
INSERT INTO t SELECT g, box(point(x, y), point(x + 0.001, y + 0.001)), point(x, y)
FROM (SELECT g, (g % 97) / 970.0 AS x, (g % 89) / 890.0 AS y
      FROM generate_series(20001, 30000) g) s;
DELETE FROM t WHERE id % 7 = 0;
VACUUM t;
ALTER INDEX t_b SET (pmem_budget = '10%');
SELECT amrtree_settle('t_b', 0.2);
CHECKPOINT;
});
cmp_ok($node->safe_psql('postgres', q{SELECT leaves FROM amrtree_tier_stats('t_b') WHERE tier = 'ssd'}),
	'>', 0, 'some leaves of t_b are on the SSD tier');

sub agrees
{
	my ($what, $prefix) = @_;
	$prefix ||= '';
	foreach my $q (q{SELECT count(*) FROM t WHERE b && box '((0.2,0.2),(0.5,0.6))'},
		q{SELECT count(*) FROM t WHERE p <@ box '((0.05,0.05),(0.5,0.6))'})
	{
		my ($with, $without) = amr_with_and_without_index($node, 'postgres', "$prefix $q");
		is($with, $without, "$what: $q agrees with a sequential scan");
	}
}

sub usage
{
	# leaf ids rather than slots: the tier manager may hold an extra slot
	# while it moves a leaf of t_b
	return $node->safe_psql('postgres', q{
SELECT leaf_ids_used || ' leaves, ' || indexes || ' indexes' FROM amrtree_pool_stats()});
}

# What the indexes of t account for, as usage() says it.
sub accounted
{
	return $node->safe_psql('postgres', q{
SELECT sum(s.leaves) || ' leaves, ' || count(*) || ' indexes'
FROM unnest(ARRAY['t_b', 't_p']::regclass[]) i, amrtree_index_stats(i) s});
}

agrees('checksummed cluster');

# pg_basebackup verifies every relation page's checksum while it copies and
# fails if one does not match.
$node->backup('b');
pass('pg_basebackup found no checksum failure');

$node->stop;
command_like([ 'pg_checksums', '--check', '-D', $node->data_dir ],
	qr/Bad checksums:\s+0/, 'pg_checksums --check: no bad checksum');

# --disable and --enable on the stopped cluster rewrite every relation page,
# amrtree's metapages included.
command_ok([ 'pg_checksums', '--disable', '-D', $node->data_dir ], 'pg_checksums --disable');
command_ok([ 'pg_checksums', '--enable', '-D', $node->data_dir ], 'pg_checksums --enable');
$node->start;
agrees('after pg_checksums --enable');
my $before = usage();
is($before, accounted(), 'the pool holds exactly the trees of t_b and t_p');

# Damage one byte of t_p's metapage -- its tree number -- so that the page
# fails its checksum, and start again.  The tree must stay: the damaged page
# is not evidence that the index is gone.
my $file = $node->data_dir . '/' . $node->safe_psql('postgres', q{SELECT pg_relation_filepath('t_p')});
$node->stop;
open(my $fh, '+<:raw', $file) or die "$file: $!";
my $at = 24 + 16;    # page header, then magic, version and pool id
sysseek($fh, $at, 0) or die;
sysread($fh, my $byte, 1) == 1 or die;
sysseek($fh, $at, 0) or die;
syswrite($fh, chr(ord($byte) ^ 0x5a), 1) == 1 or die;
close $fh;
my $log_at = -s $node->logfile;
$node->start;
is(usage(), $before, 'a metapage that fails its checksum keeps its tree');
unlike(slurp_file($node->logfile, $log_at), qr/reclaiming the trees/,
	'no tree is reclaimed');

my ($ret, $out, $err) = $node->psql('postgres', q{SELECT count(*) FROM t WHERE p <@ box '((0.05,0.05),(0.5,0.6))'});
like($err, qr/invalid page in block 0 of relation/, 'reading the damaged metapage reports it');
agrees('with ignore_checksum_failure', 'SET ignore_checksum_failure = on;');

$node->safe_psql('postgres', 'REINDEX INDEX t_p');
agrees('after REINDEX');
is(usage(), accounted(), 'REINDEX freed the old tree');
is($node->safe_psql('postgres', q{SELECT amrtree_check('t_p')}), 't', 'amrtree_check after REINDEX');

$node->stop;
command_like([ 'pg_checksums', '--check', '-D', $node->data_dir ],
	qr/Bad checksums:\s+0/, 'pg_checksums --check after REINDEX: no bad checksum');

done_testing();
