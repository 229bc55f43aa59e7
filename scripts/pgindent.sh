#!/usr/bin/env bash
# Lay out amrtree's C sources as PostgreSQL's pgindent does: pg_bsd_indent
# 2.1.1 (Debian's pg-bsd-indent, the version PostgreSQL 15's pgindent asks
# for) with pgindent's options, and its steps before and after.
#
# Usage: scripts/pgindent.sh [--check] [FILE...]
#   Without files: every .c and .h file of src/, test/ and bench/.
#   --check: change nothing; print the differences and exit 1 if any.
#
# pgindent needs the names of all typedefs.  PostgreSQL's list comes from
# its buildfarm's object files; here it is taken from the server headers of
# the installed PostgreSQL and from the project's own sources (a line that
# ends a typedef'd struct or a typedef line), which is what the layout of
# these files depends on.  pg_bsd_indent cannot lay out hexadecimal
# floating-point literals or compound literals: the sources use neither.

source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHECK=0
FILES=()
while [ $# -gt 0 ]; do
	case "$1" in
		--check) CHECK=1 ;;
		-h|--help) sed -n '2,15p' "$0"; exit 0 ;;
		*) FILES+=("$1") ;;
	esac
	shift
done

INDENT="$(command -v pg_bsd_indent || true)"
if [ -z "$INDENT" ]; then
	echo "pg_bsd_indent not found: install the Debian package pg-bsd-indent" >&2
	exit 2
fi
if ! "$INDENT" --version 2>&1 | grep -q ' 2\.1\.1 '; then
	echo "pg_bsd_indent is not version 2.1.1, the one PostgreSQL 15's pgindent uses" >&2
	exit 2
fi

cd "$AMR_ROOT"
if [ ${#FILES[@]} -eq 0 ]; then
	mapfile -t FILES < <(find src test bench -name '*.[ch]' -not -path '*/.run/*' | sort)
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

SERVER_HEADERS="$("$PG_BIN/pg_config" --includedir-server)"

# typedef names: "} Name;" closing a typedef'd struct, "typedef ... Name;",
# and "typedef ... (*Name)(...)"; plus what system headers provide
{
	grep -rhoE '^\}[[:space:]]*[A-Za-z_][A-Za-z0-9_]*[[:space:]]*;' \
		--include='*.[ch]' "$SERVER_HEADERS" src test bench |
		sed -E 's/^\}[[:space:]]*//; s/[[:space:]]*;$//'
	grep -rhoE '^typedef[^;(]*[[:space:]*][A-Za-z_][A-Za-z0-9_]*[[:space:]]*;' \
		--include='*.[ch]' "$SERVER_HEADERS" src test bench |
		sed -E 's/.*[[:space:]*]([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*;$/\1/'
	grep -rhoE '^typedef[^;]*\([[:space:]]*\*[[:space:]]*[A-Za-z_][A-Za-z0-9_]*\)' \
		--include='*.[ch]' "$SERVER_HEADERS" src test bench |
		sed -E 's/.*\([[:space:]]*\*[[:space:]]*([A-Za-z_][A-Za-z0-9_]*)\)$/\1/'
	printf '%s\n' bool size_t ssize_t off_t pid_t mode_t time_t FILE va_list \
		sigjmp_buf pthread_t uintptr_t intptr_t PMEMobjpool PMEMoid \
		int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t
} | grep -vxE 'ANY|FD_SET|U|abs|allocfunc|boolean|date|digit|ilist|interval|iterator|other|pointer|printfunc|reference|string|timestamp|type|wrap' |
	sort -u > "$TMP/typedefs"

OPTS="-bad -bap -bbb -bc -bl -cli1 -cp33 -cdb -nce -d0 -di12 -nfc1 -i4 -l79 -lp -lpl -nip -npro -sac -tpg -ts4"

changed=0
for f in "${FILES[@]}"; do
	# before: // comments become /* */, dashed block comments are kept as
	# they are; after: the reverse, a tab between run-together comments,
	# one space before the '*' of a pointer return type
	perl -0pe 's!^([ \t]*)//(.*)$!$1/* $2 */!gm; s!/\* +---!/*---X_X!g' "$f" > "$TMP/work.c"
	if ! (cd "$TMP" && "$INDENT" $OPTS "-U$TMP/typedefs" work.c >"$TMP/err" 2>&1) || [ -s "$TMP/err" ]; then
		echo "pg_bsd_indent failed on $f:" >&2
		cat "$TMP/err" >&2
		exit 2
	fi
	perl -0pe 's!/\*---X_X!/* ---!g; s!\*/(/\*.*\*/)$!*/\t$1!gm; s!^([A-Za-z_]\S*)[ \t]+\*$!$1 *!gm' \
		"$TMP/work.c" > "$TMP/out.c"
	if ! cmp -s "$f" "$TMP/out.c"; then
		changed=1
		if [ "$CHECK" = 1 ]; then
			diff -u "$f" "$TMP/out.c" | sed "2s|$TMP/out.c|$f (pgindent)|"
		else
			cp "$TMP/out.c" "$f"
			echo "laid out $f"
		fi
	fi
done
[ "$CHECK" = 1 ] && [ "$changed" = 1 ] && exit 1
exit 0
