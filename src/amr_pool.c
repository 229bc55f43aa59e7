/*-------------------------------------------------------------------------
 *
 * amr_pool.c
 *		The PMEM pool: opening, creating, laying out and enlarging it, how
 *		its stores reach durability, and what the postmaster records in its
 *		header before recovery (a crash).
 *
 * The pool is opened or created by the postmaster while it computes its
 * shared memory request, before any child exists: libpmemobj's allocator and
 * transactions are not safe across processes (docs/design.md, "Tiers and who
 * touches what"), so the postmaster is the only process that ever calls
 * pmemobj_*.  Children inherit the mapping at the same address and touch
 * the pool only through plain loads, stores and the flushes in
 * core/amr_persist.c, allocating slots from bitmaps in shared memory.
 *
 * A pool that cannot be used (another cluster's, another format version, an
 * unrelated file, no space, a rejected setting) does not stop the server:
 * it is reported at startup, and every use of an amrtree index raises an
 * ERROR that repeats the reason (amr_pool_report_unusable).
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#include <libpmem.h>
#include <libpmemobj.h>

#include "access/xlog.h"
#include "common/controldata_utils.h"
#include "miscadmin.h"
#include "utils/guc.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define AMR_POOL_MIN_MB 32

/* Postmaster-local pool state, inherited by every child through fork(). */
static PMEMobjpool *pool = NULL;
static AmrPoolStatus pool_status = AMR_POOL_NOT_CONFIGURED;
static char pool_error_msg[256];
static char pool_error_detail[1024];
static char pool_error_hint[512];
static char pool_media[128];
static bool pool_created_at_start = false;
static bool pool_upgraded_at_start = false; /* from format version 2 */

/*
 * Record why the pool cannot be used, and log it: every later use raises it
 * (amr_pool_report_unusable).  Postmaster only.
 */
void
amr_pool_fail(const char *msg, const char *detail, const char *hint)
{
	pool_status = AMR_POOL_FAILED;
	strlcpy(pool_error_msg, msg, sizeof(pool_error_msg));
	strlcpy(pool_error_detail, detail ? detail : "", sizeof(pool_error_detail));
	strlcpy(pool_error_hint, hint ? hint : "", sizeof(pool_error_hint));
	ereport(LOG,
			(errmsg("amrtree: %s", pool_error_msg),
			 pool_error_detail[0] ? errdetail("%s", pool_error_detail) : 0,
			 pool_error_hint[0] ? errhint("%s", pool_error_hint) : 0));
}

const char *
amr_pool_path_display(void)
{
	return amr_pmem_path ? amr_pmem_path : "(unset)";
}

/* A random nonzero 64-bit identity (pool ids, slot file ids). */
uint64
amr_random_id(void)
{
	uint64		id = 0;

	if (!pg_strong_random(&id, sizeof(id)))
		id = ((uint64) time(NULL) << 32) ^ (uint64) getpid();
	return id ? id : 1;
}

/*
 * The directory a pool or slot file goes into must exist -- except our own
 * default one in the data directory, pg_amrtree, which we create (0700,
 * like PGDATA).  Creating any other missing directory would turn a typo in
 * amrtree.ssd_path into a slot file on whatever disk the typo names.
 * Returns false (after pool_fail) if the directory is missing.
 */
bool
amr_prepare_parent_directory(const char *path, const char *setting)
{
	char		dir[MAXPGPATH];
	char		detail[MAXPGPATH + 64];
	char	   *slash;
	struct stat st;

	strlcpy(dir, path, sizeof(dir));
	slash = strrchr(dir, '/');
	if (slash == NULL || slash == dir)
		return true;
	*slash = '\0';
	if (strcmp(dir, "pg_amrtree") == 0)
	{
		if (mkdir(dir, S_IRWXU) != 0 && errno != EEXIST)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("amrtree: could not create directory \"%s\": %m", dir)));
		return true;
	}
	if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
		return true;
	snprintf(detail, sizeof(detail), "Directory \"%s\" does not exist.", dir);
	amr_pool_fail(psprintf("the directory of %s does not exist", setting), detail,
				  psprintf("Create it, writable by the server, or correct %s; then restart the server.",
						   setting));
	return false;
}

/*
 * A server that was just stopped may hold its pool's and slot file's locks
 * a moment after pg_ctl saw it stop: its postmaster removes postmaster.pid,
 * then exits, and the kernel tears down its shared memory (shared_buffers,
 * the pool's copy) before it closes its files and so releases their locks.
 * With 2.4 GB of shared memory that took more than the 47 ms in which
 * "pg_ctl restart" had started the next server, and that server refused
 * the pool as held by another.  So wait for the lock, up to
 * AMR_LOCK_WAIT_MS; a server that really is running keeps it, and the
 * caller refuses the file as before.
 */
#define AMR_LOCK_WAIT_MS		10000
#define AMR_LOCK_POLL_MS		20

int
amr_lock_file_waiting(int fd, const char *path)
{
	int			waited_ms = 0;
	bool		told = false;

	for (;;)
	{
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		{
			if (told)
				ereport(LOG,
						(errmsg("amrtree: \"%s\" was released after %d ms", path, waited_ms)));
			return 0;
		}
		if ((errno != EWOULDBLOCK && errno != EAGAIN) || waited_ms >= AMR_LOCK_WAIT_MS)
			return errno;
		if (!told && waited_ms >= 1000)
		{
			ereport(LOG,
					(errmsg("amrtree: waiting for another process to release \"%s\"", path),
					 errdetail("A server that was just stopped releases it as it exits; "
							   "one that is running keeps it, and amrtree stops waiting after %d s.",
							   AMR_LOCK_WAIT_MS / 1000)));
			told = true;
		}
		pg_usleep(AMR_LOCK_POLL_MS * 1000L);
		waited_ms += AMR_LOCK_POLL_MS;
	}
}

static AmrPoolHeader *
pool_header(PMEMobjpool *pop)
{
	PMEMoid		root = pmemobj_root(pop, 0);

	if (OID_IS_NULL(root) || pmemobj_root_size(pop) < AMR_POOL_HEADER_V2_SIZE)
		return NULL;
	return (AmrPoolHeader *) pmemobj_direct(root);
}

/*
 * A version 2 pool differs from version 3 only by the header's WAL extent
 * fields: make room for them (libpmemobj keeps the old contents and zeroes
 * the rest, which says "extent unknown": amr_lineage.c checks nothing until
 * the pool has recorded one).  Returns the header, NULL if there was no
 * room.
 */
static AmrPoolHeader *
pool_upgrade_v2(PMEMobjpool *pop, const char *path)
{
	AmrPoolHeader *hdr;

	if (OID_IS_NULL(pmemobj_root(pop, sizeof(AmrPoolHeader))) ||
		pmemobj_root_size(pop) < sizeof(AmrPoolHeader))
		return NULL;
	hdr = pool_header(pop);
	hdr->format_version = AMR_FORMAT_VERSION;
	pmemobj_persist(pop, &hdr->format_version, sizeof(hdr->format_version));
	ereport(LOG,
			(errmsg("amrtree: upgraded PMEM pool \"%s\" from format version 2 to %u",
					path, AMR_FORMAT_VERSION)));
	return hdr;
}

/*
 * Lay out a new pool: root header, tree directory, Leaf Table, slot area.
 * The Leaf Table has one entry per slot: a leaf occupies exactly one slot,
 * so the number of leaf ids can never exceed the number of slots.
 */
static bool
pool_format(PMEMobjpool *pop, size_t pool_size, uint64 pool_id, uint64 created_at,
			uint64 ssd_slots, uint64 ssd_file_id)
{
	PMEMoid		root,
				trees,
				lt,
				slots;
	AmrPoolHeader *hdr;
	uint64		nslots;
	uint64		lt_capacity;

	root = pmemobj_root(pop, sizeof(AmrPoolHeader));
	if (OID_IS_NULL(root))
		return false;
	hdr = (AmrPoolHeader *) pmemobj_direct(root);

	if (pmemobj_zalloc(pop, &trees, sizeof(AmrTreeRecord) * AMR_MAX_TREES, 0) != 0)
		return false;

	/*
	 * First estimate: what is left after libpmemobj's own metadata, shared
	 * between PMEM slots and Leaf Table entries (one per slot of either tier:
	 * a leaf occupies exactly one slot, so there can be no more leaf ids than
	 * slots).
	 */
	{
		int64		usable = (int64) pool_size - (int64) Min(pool_size / 2, (size_t) 10 * 1024 * 1024)
		- (int64) (ssd_slots * sizeof(AmrLeafTableEntry));

		if (usable < (int64) (16 * (AMR_SLOT_SIZE + sizeof(AmrLeafTableEntry))))
			return false;
		nslots = (uint64) usable / (AMR_SLOT_SIZE + sizeof(AmrLeafTableEntry));
	}
	nslots = Min(nslots, (uint64) AMR_MAX_SLOTS);
	lt_capacity = nslots + ssd_slots;
	while (pmemobj_zalloc(pop, &lt, lt_capacity * sizeof(AmrLeafTableEntry) + 64, 0) != 0)
	{
		nslots = nslots * 98 / 100;
		lt_capacity = nslots + ssd_slots;
		if (nslots < 16)
			return false;
	}
	/* the slot area is aligned to AMR_SLOT_SIZE by hand, hence the extra slot */
	while (pmemobj_alloc(pop, &slots, (nslots + 1) * AMR_SLOT_SIZE, 0, NULL, NULL) != 0)
	{
		nslots = nslots * 99 / 100;
		if (nslots < 16)
			return false;
	}

	memset(hdr, 0, sizeof(*hdr));
	hdr->magic = AMR_POOL_MAGIC;
	hdr->format_version = AMR_FORMAT_VERSION;
	hdr->slot_size = AMR_SLOT_SIZE;
	hdr->system_identifier = GetSystemIdentifier();
	hdr->pool_id = pool_id;
	hdr->created_at = created_at;
	hdr->pmem_nslots = nslots;
	hdr->lt_capacity = Min(lt_capacity, nslots + ssd_slots);
	hdr->ssd_file_id = ssd_file_id;
	hdr->max_trees = AMR_MAX_TREES;
	hdr->slots_offset = TYPEALIGN(AMR_SLOT_SIZE, slots.off);
	hdr->lt_offset = TYPEALIGN(64, lt.off);
	hdr->trees_offset = trees.off;
	pmemobj_persist(pop, hdr, sizeof(*hdr));
	hdr->initialized = AMR_POOL_MAGIC;
	pmemobj_persist(pop, &hdr->initialized, sizeof(hdr->initialized));
	return true;
}

static PMEMobjpool *
pool_create(const char *path, size_t size, uint64 pool_id, uint64 created_at,
			uint64 ssd_slots, uint64 ssd_file_id)
{
	PMEMobjpool *pop;

	pop = pmemobj_create(path, AMR_POOL_LAYOUT, size, S_IRUSR | S_IWUSR);
	if (pop == NULL)
	{
		char		detail[1024];

		snprintf(detail, sizeof(detail), "pmemobj_create(\"%s\", %zu MB) failed: %s",
				 path, size >> 20, pmemobj_errormsg());
		amr_pool_fail("could not create the PMEM pool", detail,
					  "Check that the directory of amrtree.pmem_path exists, is "
					  "writable by the server, and has room for amrtree.pmem_size.");
		return NULL;
	}
	if (!pool_format(pop, size, pool_id, created_at, ssd_slots, ssd_file_id))
	{
		char		detail[1024];

		snprintf(detail, sizeof(detail),
				 "%zu MB leave no room for leaf slots and a Leaf Table covering %llu SSD slots: %s",
				 size >> 20, (unsigned long long) ssd_slots, pmemobj_errormsg());
		pmemobj_close(pop);
		unlink(path);
		amr_pool_fail("could not lay out the PMEM pool", detail,
					  "Raise amrtree.pmem_size, or lower amrtree.ssd_size.");
		return NULL;
	}
	return pop;
}

/*
 * Enlarge a pool by copying it into a bigger one that keeps its identity,
 * slot numbers and leaf ids, then renaming it over the old file.  A crash
 * before the rename leaves the old pool untouched (and a stale ".grow" file
 * that the next attempt removes).
 */
static PMEMobjpool *
pool_grow(PMEMobjpool *old, const char *path, size_t new_size, uint64 ssd_slots)
{
	AmrPoolHeader *oh = pool_header(old);
	char		tmp[MAXPGPATH];
	PMEMobjpool *pop;
	AmrPoolHeader *nh;
	char	   *ob = (char *) old;
	char	   *nb;

	snprintf(tmp, sizeof(tmp), "%s.grow", path);
	unlink(tmp);
	pop = pool_create(tmp, new_size, oh->pool_id, oh->created_at, ssd_slots,
					  oh->ssd_file_id);
	if (pop == NULL)
	{
		/*
		 * pool_create logged why, as if the pool itself could not be created;
		 * say that the server goes on with the old one, and what that costs.
		 */
		unlink(tmp);
		ereport(LOG,
				(errmsg("amrtree: could not enlarge PMEM pool \"%s\" to %zu MB; it keeps its %llu leaf slots and a Leaf Table of %llu entries",
						path, new_size >> 20, (unsigned long long) oh->pmem_nslots,
						(unsigned long long) oh->lt_capacity),
				 errdetail("amrtree.pmem_size or amrtree.ssd_size asks for a larger pool; the SSD tier uses at most %llu slots until it is enlarged.",
						   (unsigned long long) (oh->lt_capacity - Min(oh->lt_capacity, oh->pmem_nslots))),
				 errhint("Make room for a copy of the pool of %zu MB next to it (\"%s\"), then restart.",
						 new_size >> 20, tmp)));
		return old;
	}
	nh = pool_header(pop);
	if (nh->pmem_nslots < oh->pmem_nslots || nh->lt_capacity < oh->lt_capacity)
	{
		pmemobj_close(pop);
		unlink(tmp);
		ereport(LOG,
				(errmsg("amrtree: not enlarging pool \"%s\": %zu MB would not hold more slots",
						path, new_size >> 20),
				 errhint("Raise amrtree.pmem_size.")));
		return old;
	}
	nb = (char *) pop;
	/* what the header says about the contents travels with them */
	nh->prune_horizon = oh->prune_horizon;
	nh->history_reset = oh->history_reset;
	nh->writeback = oh->writeback;
	nh->fenced_redo = oh->fenced_redo;
	nh->boot = oh->boot;
	nh->wal_extent_tli = oh->wal_extent_tli;
	nh->check_tli = oh->check_tli;
	nh->wal_extent = oh->wal_extent;
	nh->check_extent = oh->check_extent;
	pmemobj_persist(pop, nh, sizeof(*nh));
	pmem_memcpy_persist(nb + nh->trees_offset, ob + oh->trees_offset,
						sizeof(AmrTreeRecord) * AMR_MAX_TREES);
	pmem_memcpy_persist(nb + nh->lt_offset, ob + oh->lt_offset,
						sizeof(AmrLeafTableEntry) * oh->lt_capacity);
	pmem_memcpy_persist(nb + nh->slots_offset, ob + oh->slots_offset,
						(size_t) oh->pmem_nslots * AMR_SLOT_SIZE);
	if (!pmem_is_pmem(nb, new_size))
		pmem_msync(nb, new_size);
	pmemobj_close(pop);
	if (rename(tmp, path) != 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("amrtree: could not rename \"%s\" to \"%s\": %m", tmp, path)));
		unlink(tmp);
		return old;
	}
	pmemobj_close(old);
	pop = pmemobj_open(path, AMR_POOL_LAYOUT);
	if (pop != NULL)
		ereport(LOG,
				(errmsg("amrtree: enlarged PMEM pool \"%s\" to %zu MB", path, new_size >> 20)));
	return pop;
}

/*
 * Was the pool created at this server start (none existed, or its creation
 * had not finished)?  Then every amrtree index built before lost its tree.
 */
bool
amr_pool_created_at_start(void)
{
	return pool_created_at_start;
}

/*
 * Trees with a leaf in the lost slot file cannot answer for their rows:
 * marked damaged, they are skipped by the planner and by writes, and
 * rebuilt (amr_heal.c).  Their Leaf Table entries stay until the old
 * index's drop frees them.
 *
 * This runs before the pool forgets the lost file's identity, on the pool
 * itself: amr_store and the persistence mode are not set up yet.
 */
static void
mark_trees_with_lost_leaves(AmrPoolHeader *hdr)
{
	AmrLeafTableEntry *lt = (AmrLeafTableEntry *) ((char *) pool + hdr->lt_offset);
	AmrTreeRecord *trees = (AmrTreeRecord *) ((char *) pool + hdr->trees_offset);
	uint32		marked = 0;
	uint64		id;

	for (id = 0; id < hdr->lt_capacity; id++)
	{
		AmrTreeRecord *rec;

		if (lt[id].word == 0 || AMR_WORD_TIER(lt[id].word) != AMR_TIER_SSD ||
			lt[id].tree_no >= AMR_MAX_TREES)
			continue;
		rec = &trees[lt[id].tree_no];
		if (rec->state != AMR_TREE_VALID && rec->state != AMR_TREE_BUILDING)
			continue;
		if (!(rec->flags & AMR_TREE_FLAG_BROKEN))
		{
			rec->flags |= AMR_TREE_FLAG_BROKEN;
			pmemobj_persist(pool, &rec->flags, sizeof(rec->flags));
			marked++;
		}
	}
	if (marked > 0)
		ereport(LOG,
				(errmsg("amrtree: %u trees had leaves in the lost SSD slot file; their indexes are rebuilt",
						marked)));
}

/*
 * The slot file's leaves are lost to this pool (the file is missing, wiped,
 * truncated, or a stale one of this cluster): keep what is there under
 * another name, let the trees that had leaves on it be rebuilt
 * (mark_trees_with_lost_leaves), and start a new file.  Returns false, the
 * reason recorded, when no new file could be made.
 */
static bool
replace_slot_file(AmrPoolHeader *hdr, uint64 ssd_slots)
{
	char		aside[MAXPGPATH];
	struct stat st;

	snprintf(aside, sizeof(aside), "%s.lost-%lld", amr_ssd_path, (long long) time(NULL));
	amr_slotfile_forget_lock();
	if (stat(amr_ssd_path, &st) == 0 && rename(amr_ssd_path, aside) != 0)
		return false;			/* the first failure stays the reason */
	ereport(WARNING,
			(errmsg("amrtree: the SSD slot file \"%s\" cannot be used (%s); starting a new one",
					amr_ssd_path, pool_error_msg),
			 errdetail("%s%s%s", pool_error_detail,
					   stat(aside, &st) == 0 ? " The old file was kept as " : "",
					   stat(aside, &st) == 0 ? aside : ""),
			 errhint("The amrtree indexes that had leaves on it are rebuilt in the background (amrtree.auto_rebuild), or need REINDEX.")));

	/*
	 * Mark the trees first, durably: the cleared file id below is all that
	 * says the Leaf Table's SSD entries point into a file that is gone.  A
	 * start that ends after it (the new file cannot be created, say) would
	 * otherwise leave the next one to create or adopt a file, accept it, and
	 * serve those trees from slots that never held their leaves.
	 */
	mark_trees_with_lost_leaves(hdr);
	hdr->ssd_file_id = 0;
	pmem_persist(&hdr->ssd_file_id, sizeof(hdr->ssd_file_id));
	if (!pmem_is_pmem(hdr, sizeof(*hdr)))
		pmem_msync(hdr, sizeof(*hdr));
	pool_status = AMR_POOL_NOT_CONFIGURED;
	return amr_slotfile_open(amr_ssd_path, ssd_slots, hdr);
}

/* Decide how stores reach durability on this pool's medium. */
static void
choose_persistence(const char *path, void *base, size_t len, size_t file_size)
{
	struct statfs fs;
	bool		is_pmem = pmem_is_pmem(base, len) != 0;
	bool		on_tmpfs = statfs(path, &fs) == 0 && fs.f_type == TMPFS_MAGIC;
	AmrPersistMode mode = (AmrPersistMode) amr_persist_mode_setting;

	if (is_pmem)
		strlcpy(pool_media, "persistent memory (DAX)", sizeof(pool_media));
	else if (on_tmpfs)
		strlcpy(pool_media, "DRAM-backed tmpfs (emulated PMEM: survives process crashes, not power loss)",
				sizeof(pool_media));
	else if (mode != AMR_PERSIST_NOP && amr_writeback_enabled &&
			 amr_wb_start(path, (char *) pool, file_size, amr_store.header))
	{
		/* the copy is made: from now on amr_store points into it */
		char	   *copy = amr_wb_copy_base();
		ptrdiff_t	delta = copy - (char *) pool;

		amr_store.pool_base = copy;
		amr_store.header = (AmrPoolHeader *) ((char *) amr_store.header + delta);
		amr_store.pmem_slots += delta;
		amr_store.lt = (AmrLeafTableEntry *) ((char *) amr_store.lt + delta);
		amr_store.tree_records = (AmrTreeRecord *) ((char *) amr_store.tree_records + delta);
		strlcpy(pool_media, "a disk file, written back in the background (commits are durable through the WAL)",
				sizeof(pool_media));
		mode = AMR_PERSIST_HOOK;
	}
	else
	{
		strlcpy(pool_media, "a disk file (persisted with msync)", sizeof(pool_media));
		if (mode != AMR_PERSIST_NOP)
			mode = AMR_PERSIST_MSYNC;
	}
	amr_persist_init(mode);
}

/* Leaves of live trees that the pool's Leaf Table places on the SSD tier. */
static uint64
live_ssd_leaves(const AmrPoolHeader *hdr)
{
	const AmrLeafTableEntry *lt = (const AmrLeafTableEntry *) ((const char *) pool + hdr->lt_offset);
	const AmrTreeRecord *trees = (const AmrTreeRecord *) ((const char *) pool + hdr->trees_offset);
	uint64		n = 0;
	uint64		id;

	for (id = 0; id < hdr->lt_capacity; id++)
	{
		const AmrTreeRecord *rec;

		if (AMR_WORD_TIER(lt[id].word) != AMR_TIER_SSD || lt[id].tree_no >= AMR_MAX_TREES)
			continue;
		rec = &trees[lt[id].tree_no];
		if ((rec->state == AMR_TREE_VALID || rec->state == AMR_TREE_BUILDING) &&
			rec->generation == lt[id].tree_generation)
			n++;
	}
	return n;
}

/*
 * Is there to be an SSD tier, given amrtree.ssd_size and what the pool's
 * leaves need?  A slot file that no live leaf refers to is forgotten, so
 * that amrtree.ssd_size = 0 really disables the tier (and a deleted file
 * that held nothing is not reported missing); one that holds leaves stays,
 * whatever the setting, until they are moved back to PMEM.  *ssd_slots is
 * the size to open or create the file with.
 */
static bool
decide_ssd_tier(AmrPoolHeader *hdr, uint64 *ssd_slots)
{
	uint64		leaves;
	struct stat st;
	bool		exists;

	if (amr_ssd_path == NULL || amr_ssd_path[0] == '\0')
		return false;
	exists = stat(amr_ssd_path, &st) == 0;
	leaves = hdr->ssd_file_id != 0 ? live_ssd_leaves(hdr) : 0;
	if (hdr->ssd_file_id != 0 && leaves == 0 && (amr_ssd_size_mb == 0 || !exists))
	{
		ereport(LOG,
				(errmsg("amrtree: no leaf is on the SSD tier; %s slot file \"%s\"",
						exists ? "no longer using" : "forgetting the missing", amr_ssd_path)));
		hdr->ssd_file_id = 0;
		pmem_persist(&hdr->ssd_file_id, sizeof(hdr->ssd_file_id));
		if (!pmem_is_pmem(hdr, sizeof(*hdr)))
			pmem_msync(hdr, sizeof(*hdr));
	}
	if (amr_ssd_size_mb > 0)
		return true;
	if (leaves == 0)
		return false;
	ereport(WARNING,
			(errmsg("amrtree: amrtree.ssd_size = 0, but " UINT64_FORMAT " leaves are on the SSD tier; it stays enabled",
					leaves),
			 errhint("Move them to PMEM first: ALTER INDEX ... SET (tiering = off) and SELECT amrtree_settle(...) for each amrtree index; the tier is disabled at the next start after that.")));
	*ssd_slots = Max(*ssd_slots, amr_slotfile_peek_slots(amr_ssd_path));
	return true;
}

static void pool_open_or_create(void);

/*
 * A pool file this server cannot use (not a pool, another format, another
 * cluster's) is renamed, kept for whoever wants to look at it, and a new
 * pool is made in its place: the indexes built in the old one then heal
 * (amr_heal.c) instead of failing every query and write.  Returns false
 * when the file could not be renamed (the caller reports the problem).
 */
static bool
set_pool_aside(const char *path, const char *why, const char *detail)
{
	char		aside[MAXPGPATH];

	snprintf(aside, sizeof(aside), "%s.unusable-%lld", path, (long long) time(NULL));
	if (rename(path, aside) != 0)
		return false;
	ereport(WARNING,
			(errmsg("amrtree: the PMEM pool \"%s\" cannot be used (%s); it was renamed to \"%s\" and a new pool is created",
					path, why, aside),
			 errdetail("%s", detail),
			 errhint("The amrtree indexes built in the old pool are rebuilt in the background (amrtree.auto_rebuild), or need REINDEX.  Do not put the old file back: its trees lack what was written since.")));
	pool_open_or_create();
	return true;
}

static void
pool_open_or_create(void)
{
	const char *path = amr_pmem_path;
	size_t		want = (size_t) Max(amr_pmem_size_mb, AMR_POOL_MIN_MB) * 1024 * 1024;
	uint64		ssd_want = (uint64) amr_ssd_size_mb * 1024 * 1024 / AMR_SLOT_SIZE;
	uint64		ssd_slots;
	struct stat st;
	AmrPoolHeader *hdr;
	char		detail[1024];

	if (path == NULL || path[0] == '\0')
	{
		amr_pool_fail("amrtree.pmem_path is empty", NULL,
					  "Set amrtree.pmem_path in postgresql.conf and restart the server.");
		return;
	}
	{
		const char *why;
		const char *setting = amr_rejected_setting(&why);

		if (setting != NULL)
		{
			amr_pool_fail(psprintf("the setting %s is not valid", setting), why,
						  "Correct it in postgresql.conf and restart the server.  "
						  "PostgreSQL ignored it and would have used the default instead.");
			return;
		}
	}

	/* the Leaf Table must cover the SSD slots too: know how many first */
	ssd_want = Min(ssd_want, (uint64) AMR_MAX_SLOTS);
	ssd_slots = Max(ssd_want, amr_ssd_path ? amr_slotfile_peek_slots(amr_ssd_path) : 0);

	if (stat(path, &st) != 0)
	{
		if (errno != ENOENT)
		{
			snprintf(detail, sizeof(detail), "stat(\"%s\") failed: %s", path, strerror(errno));
			amr_pool_fail("could not access the PMEM pool", detail, NULL);
			return;
		}
		if (!amr_prepare_parent_directory(path, "amrtree.pmem_path"))
			return;
		pool = pool_create(path, want, amr_random_id(), (uint64) time(NULL), ssd_slots, 0);
		if (pool == NULL)
			return;
		pool_created_at_start = true;
		ereport(LOG, (errmsg("amrtree: created PMEM pool \"%s\" (%zu MB)", path, want >> 20)));
	}
	else
	{
		int			lock_fd = open(path, O_RDONLY | PG_BINARY, 0);

		/*
		 * libpmemobj takes the pool's lock without waiting: wait here for a
		 * server that is still exiting, then let it go (closing the file
		 * releases it) for pmemobj_open to take.
		 */
		if (lock_fd >= 0)
		{
			(void) amr_lock_file_waiting(lock_fd, path);
			close(lock_fd);
		}
		pool = pmemobj_open(path, AMR_POOL_LAYOUT);
		if (pool == NULL)
		{
			int			open_errno = errno;

			snprintf(detail, sizeof(detail), "pmemobj_open(\"%s\") failed: %s",
					 path, pmemobj_errormsg());
			/* held by another server: never touch it */
			if (open_errno != EWOULDBLOCK && open_errno != EAGAIN &&
				set_pool_aside(path, "it is not an amrtree pool", detail))
				return;
			amr_pool_fail("could not open the PMEM pool", detail,
						  "The file is not an amrtree pool, or another server has it "
						  "open.  Stop that server, or move the file away (its indexes "
						  "then need REINDEX), or point amrtree.pmem_path elsewhere.");
			return;
		}
		hdr = pool_header(pool);
		if (hdr == NULL || hdr->initialized != AMR_POOL_MAGIC)
		{
			/* creation never finished: nothing can reference this pool */
			ereport(LOG,
					(errmsg("amrtree: PMEM pool \"%s\" was never completely created; recreating it",
							path)));
			pmemobj_close(pool);
			unlink(path);
			pool = pool_create(path, want, amr_random_id(), (uint64) time(NULL), ssd_slots, 0);
			if (pool == NULL)
				return;
			pool_created_at_start = true;
			hdr = pool_header(pool);
		}
		if (hdr->magic == AMR_POOL_MAGIC && hdr->format_version == 2 &&
			hdr->slot_size == AMR_SLOT_SIZE)
		{
			AmrPoolHeader *upgraded = pool_upgrade_v2(pool, path);

			if (upgraded != NULL)
			{
				hdr = upgraded;
				pool_upgraded_at_start = true;
			}
		}
		else if (hdr->magic == AMR_POOL_MAGIC && hdr->format_version == AMR_FORMAT_VERSION &&
				 AMR_FAULT_ACTIVE("upgrade:extent_unknown"))
		{
			/* a test's stand-in for that upgrade: what version 3 added, zero */
			memset(&hdr->wal_extent_tli, 0, sizeof(AmrPoolHeader) - AMR_POOL_HEADER_V2_SIZE);
			pmemobj_persist(pool, &hdr->wal_extent_tli,
							sizeof(AmrPoolHeader) - AMR_POOL_HEADER_V2_SIZE);
			pool_upgraded_at_start = true;
		}
		if (hdr->magic != AMR_POOL_MAGIC || hdr->format_version != AMR_FORMAT_VERSION ||
			hdr->slot_size != AMR_SLOT_SIZE)
		{
			snprintf(detail, sizeof(detail),
					 "The pool has format version %u and slot size %u; this build of amrtree uses version %u and slot size %u.",
					 hdr->format_version, hdr->slot_size, AMR_FORMAT_VERSION, AMR_SLOT_SIZE);
			pmemobj_close(pool);
			pool = NULL;
			if (set_pool_aside(path, "it has an incompatible format", detail))
				return;
			amr_pool_fail("the PMEM pool has an incompatible format", detail,
						  "Move the pool file away and restart; then REINDEX every amrtree index.");
			return;
		}
		if (hdr->system_identifier != GetSystemIdentifier())
		{
			snprintf(detail, sizeof(detail),
					 "The pool belongs to the cluster with system identifier " UINT64_FORMAT
					 ", this cluster's is " UINT64_FORMAT ".",
					 hdr->system_identifier, GetSystemIdentifier());
			pmemobj_close(pool);
			pool = NULL;
			if (set_pool_aside(path, "it belongs to another cluster", detail))
				return;
			amr_pool_fail("the PMEM pool belongs to another cluster", detail,
						  "Point amrtree.pmem_path at this cluster's own pool, or move "
						  "the foreign file away and restart; then REINDEX every amrtree index.");
			return;
		}
		if ((st.st_size > 0 && (size_t) st.st_size < want) ||
			hdr->lt_capacity < hdr->pmem_nslots + ssd_slots)
		{
			/*
			 * a bigger pool: more PMEM slots, or a Leaf Table for more SSD
			 * slots
			 */
			size_t		need = (size_t) st.st_size +
			(size_t) (hdr->pmem_nslots + ssd_slots - Min(hdr->lt_capacity, hdr->pmem_nslots + ssd_slots))
			* sizeof(AmrLeafTableEntry) + 2 * 1024 * 1024;
			PMEMobjpool *grown = pool_grow(pool, path, Max(want, need), ssd_slots);

			if (grown == NULL)
			{
				snprintf(detail, sizeof(detail), "%s", pmemobj_errormsg());
				amr_pool_fail("could not reopen the PMEM pool after enlarging it", detail, NULL);
				return;
			}
			pool = grown;
		}
	}

	hdr = pool_header(pool);
	if (hdr->lt_capacity < hdr->pmem_nslots + Min(ssd_slots, hdr->lt_capacity))
		ssd_slots = hdr->lt_capacity - hdr->pmem_nslots;
	if (!decide_ssd_tier(hdr, &ssd_slots))
		;						/* no SSD tier */
	else if (!amr_slotfile_open(amr_ssd_path, ssd_slots, hdr) &&
			 !(amr_slotfile_was_lost() && replace_slot_file(hdr, ssd_slots)))
	{
		pmemobj_close(pool);
		pool = NULL;
		return;
	}
	/* never use more SSD slots than the Leaf Table can name */
	amr_slotfile_limit_slots(hdr->lt_capacity - hdr->pmem_nslots);

	amr_store.pool_base = (char *) pool;
	amr_store.header = hdr;
	amr_store.pmem_slots = (char *) pool + hdr->slots_offset;
	amr_store.pmem_nslots = (uint32) hdr->pmem_nslots;
	amr_store.lt = (AmrLeafTableEntry *) ((char *) pool + hdr->lt_offset);
	amr_store.lt_capacity = (uint32) hdr->lt_capacity;
	amr_store.tree_records = (AmrTreeRecord *) ((char *) pool + hdr->trees_offset);
	amr_store.ssd_nslots = amr_slotfile_nslots();
	if (stat(path, &st) != 0)
		st.st_size = 0;
	choose_persistence(path, amr_store.pmem_slots,
					   (size_t) amr_store.pmem_nslots * AMR_SLOT_SIZE, (size_t) st.st_size);
	pool_status = AMR_POOL_READY;
	ereport(LOG,
			(errmsg("amrtree: PMEM pool \"%s\": %u leaf slots of %d bytes, Leaf Table of %u entries, on %s; persisting with %s",
					path, amr_store.pmem_nslots, AMR_SLOT_SIZE, amr_store.lt_capacity,
					pool_media, amr_persist_describe())));
	if (amr_slotfile_nslots() > 0)
		ereport(LOG, (errmsg("amrtree: SSD tier %s", amr_slotfile_describe())));
}

void
amr_pool_describe(StringInfo buf)
{
	appendStringInfo(buf, "%s on %s, persisting with %s", amr_pool_path_display(),
					 pool_media, amr_persist_describe());
	amr_wb_describe(buf);
	if (amr_slotfile_nslots() > 0)
		appendStringInfo(buf, "; SSD tier %s", amr_slotfile_describe());
	else
		appendStringInfoString(buf, "; no SSD tier");
}


/*
 * Whether this start may be WAL replay over a copy of the pool, not over
 * the pool this server itself last wrote: the data directory starts from a
 * base backup (backup_label), for archive recovery (recovery.signal) or as a
 * standby (standby.signal).  Replay treats the two differently (see
 * amr_walredo.c).  Postmaster, before recovery removes the evidence;
 * inherited by the startup process.
 */
static bool pool_may_be_copy = false;

static void
note_replay_source(void)
{
	static const char *const markers[] = {"backup_label", "recovery.signal", "standby.signal"};
	int			i;

	pool_may_be_copy = false;
	for (i = 0; i < lengthof(markers); i++)
	{
		char		path[MAXPGPATH];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", DataDir, markers[i]);
		if (stat(path, &st) == 0)
			pool_may_be_copy = true;
	}
}

bool
amr_pool_may_be_a_copy(void)
{
	/* a write-back pool's file is always a copy (amr_writeback.c) */
	return pool_may_be_copy || amr_wb_active();
}

/*
 * Postmaster, pool open or the postmaster restarting its children after a
 * crash: what the control file says about this start goes into the pool
 * before recovery removes the evidence.  If the start follows a crash (the
 * control file was not left "shut down", or children crashed), record it
 * so that the reconciliation prunes and empties unlogged trees, as
 * PostgreSQL resets unlogged relations in the same case (see
 * amr_note_unclean_start); and check that this data directory's WAL leads
 * to the pool's contents (amr_lineage.c).
 */
static void
note_start(bool children_crashed)
{
	bool		crc_ok = false;
	ControlFileData *cf = get_controlfile(DataDir, &crc_ok);
	bool		clean = crc_ok && (cf->state == DB_SHUTDOWNED ||
								   cf->state == DB_SHUTDOWNED_IN_RECOVERY);

	if (children_crashed || !clean)
		amr_note_unclean_start(cf->checkPoint);
	if (children_crashed)
		amr_lineage_at_crash_restart(crc_ok ? cf : NULL, pool_may_be_copy);
	else
		amr_lineage_at_open(crc_ok ? cf : NULL, pool_may_be_copy, pool_upgraded_at_start);
	pfree(cf);
}

/* The pool is mapped and usable (in any process, even during recovery). */
bool
amr_pool_is_open(void)
{
	return pool_status == AMR_POOL_READY && amr_store.header != NULL;
}

/* The pool is open and usable (any process). */
bool
amr_pool_ready(void)
{
	return pool_status == AMR_POOL_READY;
}

/*
 * Postmaster, computing its shared memory request: open or create the pool
 * and the slot file, and record in the pool header whether this start
 * follows a crash before recovery removes the evidence.
 */
void
amr_pool_open_at_start(void)
{
	pool_open_or_create();
	note_replay_source();
	if (pool_status == AMR_POOL_READY)
		note_start(false);
}

/* Postmaster, restarting its children after one of them crashed. */
void
amr_pool_note_crash_restart(void)
{
	/* what only the DRAM copy held is gone, as WAL buffers are */
	amr_wb_reload();
	note_replay_source();
	if (pool_status == AMR_POOL_READY)
		note_start(true);
}

/* Raise the ERROR that says why the pool cannot be used. */
void
amr_pool_report_unusable(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("amrtree PMEM pool \"%s\" is not usable: %s",
					amr_pool_path_display(), pool_error_msg),
			 pool_error_detail[0] ? errdetail("%s", pool_error_detail) : 0,
			 pool_error_hint[0] ? errhint("%s", pool_error_hint) : 0));
}
