#!/usr/bin/env bash
# Make a private, relocated copy of the PostgreSQL 15 packages under DIR, for
# running several test suites or benchmarks at once (one per worktree)
# without their "make install" overwriting each other's amrtree:
#
#   scripts/private-pg.sh /opt/pg-mine
#   AMR_PG_ROOT=/opt/pg-mine scripts/test.sh
#
# Debian's PostgreSQL finds its share and lib directories relative to its
# binaries, so a copy of the three trees works as an installation of its own.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DIR="${1:?usage: scripts/private-pg.sh DIR}"
install_deps
as_root mkdir -p "$DIR/usr/lib/postgresql" "$DIR/usr/share/postgresql" "$DIR/usr/include"
as_root rm -rf "$DIR/usr/lib/postgresql/$PG_MAJOR" "$DIR/usr/share/postgresql/$PG_MAJOR" "$DIR/usr/include/postgresql"
as_root cp -a "/usr/lib/postgresql/$PG_MAJOR" "$DIR/usr/lib/postgresql/"
as_root cp -a "/usr/share/postgresql/$PG_MAJOR" "$DIR/usr/share/postgresql/"
as_root cp -a /usr/include/postgresql "$DIR/usr/include/"
echo "private PostgreSQL at $DIR: $("$DIR/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" --version)"
echo "use it with: AMR_PG_ROOT=$DIR scripts/test.sh"
