# Failover and pg_rewind: a standby (a base backup with the pool and slot
# file at their defaults, inside the data directory) is promoted while the
# old primary keeps taking writes, so the two diverge -- inserts that split
# leaves, deletes and VACUUM on both sides.  The old primary is stopped,
# rewound with pg_rewind from the new primary (which copies the pool and
# slot file whole, as files it does not know, while the source runs), and
# started as a standby of the new primary.  Once caught up it holds the new
# primary's rows, not its own diverged ones: every strategy through its
# amrtree index returns what its sequential scan returns, the index digest
# equals the new primary's, and amrtree_check passes; after its promotion
# it takes writes.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use lib $ENV{AMR_SRC} ? "$ENV{AMR_SRC}/t" : 't';
use AmrTree;
use AmrWal;

my $old = amrwal_primary('rw_old', rows => 20000, seed => 27);
$old->append_conf('postgresql.conf', "wal_log_hints = on\n");
$old->restart;
amrwal_setup($old);
amrwal_windows($old, 'trips', 120);
$old->backup('b');
my $new = PostgreSQL::Test::Cluster->new('rw_new');
$new->init_from_backup($old, 'b', has_streaming => 1);
$new->start;
$old->wait_for_catchup($new);
my ($mismatch, $info) = amrwal_parity($new, 'trips');
is($mismatch, 0, "the standby agrees with a sequential scan ($info)");

# failover: the standby is promoted, the old primary goes on for a while
$new->promote;
$new->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
my $diverge = q{
INSERT INTO trips SELECT nextval('trip_ids'), box(point((b[0])[0] + %s, (b[0])[1]), point((b[1])[0] + %s, (b[1])[1])), t
  FROM trips WHERE id %% %d = 1;
DELETE FROM trips WHERE id %% 13 = %d;
VACUUM trips;
};
$old->safe_psql('postgres', sprintf($diverge, '0.0004', '0.0004', 5, 1));
$new->safe_psql('postgres', sprintf($diverge, '-0.0003', '-0.0003', 7, 2));
$new->safe_psql('postgres', 'CHECKPOINT');
my $new_rows = $new->safe_psql('postgres', 'SELECT count(*) FROM trips');
isnt($old->safe_psql('postgres', 'SELECT count(*) FROM trips'), $new_rows, 'the two servers diverged');

# rewind the old primary from the running new one, and follow it
$old->stop;
# pg_rewind copies the source's configuration files too: keep our own
my $conf = $old->data_dir . '/postgresql.conf';
my $saved_conf = slurp_file($conf);
command_ok(
	[
		'pg_rewind', '--target-pgdata', $old->data_dir,
		'--source-server', $new->connstr('postgres'), '--no-sync'
	],
	'pg_rewind');
open(my $fh, '>', $conf) or die "open $conf: $!";
print $fh $saved_conf;
close $fh;
$old->enable_streaming($new);
$old->start;
$new->safe_psql('postgres', q{
INSERT INTO trips SELECT nextval('trip_ids'), box(point((b[0])[0], (b[0])[1] + 0.0002), point((b[1])[0], (b[1])[1] + 0.0002)), t
  FROM trips WHERE id % 17 = 3;});
$new->wait_for_catchup($old);

is($old->safe_psql('postgres', 'SELECT count(*) FROM trips'),
	$new->safe_psql('postgres', 'SELECT count(*) FROM trips'), 'the rewound server holds the new primary\'s rows');
is(amrwal_check($old, 'trips_b'), 't', 'rewound: amrtree_check');
my ($m, $i, $seq, $idx) = amrwal_parity($old, 'trips');
is($m, 0, "rewound: every strategy through the index agrees with a sequential scan ($i)");
my (undef, undef, undef, $new_idx) = amrwal_parity($new, 'trips');
amrwal_same_digest($idx, $new_idx, 'rewound: the index returns what the new primary\'s index returns');

# and it can take over again
$old->promote;
$old->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
$old->safe_psql('postgres', q{
INSERT INTO trips SELECT nextval('trip_ids'), box(point(-8.61, 41.15), point(-8.609, 41.151)), 0 FROM generate_series(1, 500);
DELETE FROM trips WHERE id % 19 = 4;
VACUUM trips;});
($m, $i) = amrwal_parity($old, 'trips');
is($m, 0, "rewound and promoted: after writes the index agrees with a sequential scan ($i)");
is(amrwal_check($old, 'trips_b'), 't', 'rewound and promoted: amrtree_check');

$old->stop;
$new->stop;
done_testing();
