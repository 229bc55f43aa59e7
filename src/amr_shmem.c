/*-------------------------------------------------------------------------
 *
 * amr_shmem.c
 *		The DRAM tier (shared memory) and the PMEM pool.
 *
 * The pool is opened or created by the postmaster while it computes its
 * shared memory request, before any child exists: libpmemobj's allocator and
 * transactions are not safe across processes (DESIGN 2), so the postmaster is
 * the only process that ever calls pmemobj_*.  Children inherit the mapping
 * at the same address and touch the pool only through plain loads, stores
 * and the flushes in core/amr_persist.c, allocating slots from bitmaps that
 * live in shared memory.
 *
 * A pool that cannot be used (another cluster's, another format version, an
 * unrelated file, no space) does not stop the server: it is reported at
 * startup, and every use of an amrtree index raises an ERROR that repeats
 * the reason.
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
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

#define AMR_POOL_MIN_MB 32

AmrSharedState *amr_shared = NULL;
AmrStore	amr_store;
LWLock	   *amr_tree_locks = NULL;
LWLock	   *amr_leaf_locks = NULL;
AmrBitmap  *amr_leaf_cache_used = NULL;
AmrLeaf    *amr_leaf_cache = NULL;
uint32		amr_leaf_cache_n = 0;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Postmaster-local pool state, inherited by every child through fork(). */
static PMEMobjpool *pool = NULL;
static AmrPoolStatus pool_status = AMR_POOL_NOT_CONFIGURED;
static char pool_error_msg[256];
static char pool_error_detail[1024];
static char pool_error_hint[512];
static char pool_media[128];
static int	shmem_startups = 0;
static int	ssd_lock_fd = -1;	/* flock()ed for the postmaster's lifetime */

/* SSD slot file (opened by the postmaster, inherited by every child) */
AmrSsdIo	amr_ssd_io = {-1, AMR_IO_URING, AMR_SSD_SYNC_FDATASYNC, false, NULL, 0};
static uint32 ssd_nslots = 0;
static char ssd_media[128];

typedef struct AmrShmemLayout
{
	Size		total;
	Size		off_tree_locks;
	Size		off_trees;
	Size		off_leaf_locks;
	Size		off_leaves;
	Size		off_pmem_bitmap;
	Size		off_ids_bitmap;
	Size		off_nodes_bitmap;
	Size		off_nodes;
	uint32		nnodes;
	Size		off_ssd_bitmap;
	Size		off_cache_bitmap;
	Size		off_cache;
	uint32		ncache;
	Size		off_ssd_cache;
	uint32		nssd_cache;
} AmrShmemLayout;

static void
pool_fail(const char *msg, const char *detail, const char *hint)
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

static uint64
random_pool_id(void)
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
static bool
prepare_parent_directory(const char *path, const char *setting)
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
	pool_fail(psprintf("the directory of %s does not exist", setting), detail,
			  psprintf("Create it, writable by the server, or correct %s; then restart the server.",
					   setting));
	return false;
}

static AmrPoolHeader *
pool_header(PMEMobjpool *pop)
{
	PMEMoid		root = pmemobj_root(pop, 0);

	if (OID_IS_NULL(root) || pmemobj_root_size(pop) < sizeof(AmrPoolHeader))
		return NULL;
	return (AmrPoolHeader *) pmemobj_direct(root);
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
	 * between PMEM slots and Leaf Table entries (one per slot of either
	 * tier: a leaf occupies exactly one slot, so there can be no more leaf
	 * ids than slots).
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
		pool_fail("could not create the PMEM pool", detail,
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
		pool_fail("could not lay out the PMEM pool", detail,
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
		return old;
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

/* Decide how stores reach durability on this pool's medium. */
static void
choose_persistence(const char *path, void *base, size_t len)
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
	else
	{
		strlcpy(pool_media, "a disk file (persisted with msync)", sizeof(pool_media));
		if (mode != AMR_PERSIST_NOP)
			mode = AMR_PERSIST_MSYNC;
	}
	amr_persist_init(mode);
}

/* ---- the SSD slot file ---- */

static bool
read_ssd_header(int fd, AmrSsdHeader *h)
{
	char		buf[AMR_SLOT_SIZE];

	if (pread(fd, buf, sizeof(buf), 0) != sizeof(buf))
		return false;
	memcpy(h, buf, sizeof(*h));
	return h->magic == AMR_SSD_MAGIC;
}

static bool
write_ssd_header(int fd, const AmrSsdHeader *h)
{
	char		buf[AMR_SLOT_SIZE];

	memset(buf, 0, sizeof(buf));
	memcpy(buf, h, sizeof(*h));
	return pwrite(fd, buf, sizeof(buf), 0) == sizeof(buf) && fsync(fd) == 0;
}

/* Slots of an existing slot file, so that the Leaf Table can cover them. */
static uint64
peek_ssd_slots(const char *path)
{
	AmrSsdHeader h;
	int			fd = open(path, O_RDONLY | PG_BINARY, 0);
	uint64		n = 0;

	if (fd < 0)
		return 0;
	if (read_ssd_header(fd, &h))
		n = h.nslots;
	close(fd);
	return n;
}

/*
 * Open, validate, create or enlarge the slot file, for the pool "hdr".  On
 * failure the whole of amrtree is unusable (the pool's Leaf Table may point
 * into the file), with the reason stored for every later use.
 */
static bool
ssd_open_or_create(const char *path, uint64 want_slots, AmrPoolHeader *hdr)
{
	char		detail[1024];
	AmrSsdHeader h;
	struct stat st;
	int			fd;
	int			flags = O_RDWR | PG_BINARY;

	if (stat(path, &st) != 0)
	{
		if (errno != ENOENT)
		{
			snprintf(detail, sizeof(detail), "stat(\"%s\") failed: %s", path, strerror(errno));
			pool_fail("could not access the SSD slot file", detail, NULL);
			return false;
		}
		if (hdr->ssd_file_id != 0)
		{
			snprintf(detail, sizeof(detail),
					 "The PMEM pool's Leaf Table refers to leaves in slot file %016llx, which is gone.",
					 (unsigned long long) hdr->ssd_file_id);
			pool_fail("the SSD slot file is missing", detail,
					  "Restore the file at amrtree.ssd_path, or move the PMEM pool away too and "
					  "restart; then REINDEX every amrtree index.");
			return false;
		}
		if (want_slots == 0)
			return true;		/* no SSD tier */
		if (!prepare_parent_directory(path, "amrtree.ssd_path"))
			return false;
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | PG_BINARY, S_IRUSR | S_IWUSR);
		if (fd < 0 ||
			posix_fallocate(fd, 0, (off_t) ((want_slots + 1) * AMR_SLOT_SIZE)) != 0)
		{
			snprintf(detail, sizeof(detail), "creating \"%s\" (%llu MB) failed: %s", path,
					 (unsigned long long) ((want_slots * AMR_SLOT_SIZE) >> 20), strerror(errno));
			if (fd >= 0)
			{
				close(fd);
				unlink(path);
			}
			pool_fail("could not create the SSD slot file", detail,
					  "Check that the directory of amrtree.ssd_path exists, is writable by "
					  "the server, and has room for amrtree.ssd_size.");
			return false;
		}
		memset(&h, 0, sizeof(h));
		h.magic = AMR_SSD_MAGIC;
		h.format_version = AMR_SSD_FORMAT_VERSION;
		h.slot_size = AMR_SLOT_SIZE;
		h.system_identifier = GetSystemIdentifier();
		h.pool_id = hdr->pool_id;
		h.file_id = random_pool_id();
		h.nslots = want_slots;
		h.created_at = (uint64) time(NULL);
		h.checksum = amr_ssd_header_checksum(&h);
		if (!write_ssd_header(fd, &h))
		{
			snprintf(detail, sizeof(detail), "writing the header of \"%s\" failed: %s", path, strerror(errno));
			close(fd);
			unlink(path);
			pool_fail("could not create the SSD slot file", detail, NULL);
			return false;
		}
		close(fd);
		/* the pool records which file its Leaf Table points into */
		hdr->ssd_file_id = h.file_id;
		pmem_persist(&hdr->ssd_file_id, sizeof(hdr->ssd_file_id));
		if (!pmem_is_pmem(hdr, sizeof(*hdr)))
			pmem_msync(hdr, sizeof(*hdr));
		ereport(LOG, (errmsg("amrtree: created SSD slot file \"%s\" (%llu slots)", path,
							 (unsigned long long) want_slots)));
	}

	/*
	 * One server per slot file, as libpmemobj's lock gives one server per
	 * pool: a second server (a standby on the same host with the same path,
	 * say) must not adopt or write it.  The lock lives as long as this
	 * descriptor, which the postmaster keeps open and its children inherit.
	 */
	if (ssd_lock_fd < 0)
	{
		ssd_lock_fd = open(path, O_RDONLY | PG_BINARY, 0);
		if (ssd_lock_fd >= 0 && flock(ssd_lock_fd, LOCK_EX | LOCK_NB) != 0)
		{
			snprintf(detail, sizeof(detail), "flock(\"%s\") failed: %s", path, strerror(errno));
			close(ssd_lock_fd);
			ssd_lock_fd = -1;
			pool_fail("the SSD slot file is in use by another server", detail,
					  "Give every server its own amrtree.ssd_path (and amrtree.pmem_path).");
			return false;
		}
	}

	fd = open(path, O_RDWR | PG_BINARY, 0);
	if (fd < 0 || !read_ssd_header(fd, &h) || h.checksum != amr_ssd_header_checksum(&h))
	{
		snprintf(detail, sizeof(detail), "\"%s\" has no valid amrtree slot file header%s%s",
				 path, fd < 0 ? ": " : "", fd < 0 ? strerror(errno) : "");
		if (fd >= 0)
			close(fd);
		pool_fail("the SSD slot file is not an amrtree slot file", detail,
				  "Point amrtree.ssd_path at this cluster's slot file.");
		return false;
	}
	if (h.format_version != AMR_SSD_FORMAT_VERSION || h.slot_size != AMR_SLOT_SIZE)
	{
		snprintf(detail, sizeof(detail), "The slot file has format version %u, this build uses %u.",
				 h.format_version, AMR_SSD_FORMAT_VERSION);
		close(fd);
		pool_fail("the SSD slot file has an incompatible format", detail,
				  "Move the slot file and the PMEM pool away and restart; then REINDEX every amrtree index.");
		return false;
	}
	if (h.system_identifier == GetSystemIdentifier() && h.pool_id != hdr->pool_id &&
		hdr->ssd_file_id == 0)
	{
		/*
		 * The slot file of this cluster's previous pool, which is gone (a
		 * wiped /dev/shm, say): nothing can reach its leaves any more, and
		 * the indexes that had them report their missing tree.  Reuse it.
		 */
		h.pool_id = hdr->pool_id;
		h.file_id = random_pool_id();
		h.checksum = amr_ssd_header_checksum(&h);
		if (!write_ssd_header(fd, &h))
		{
			snprintf(detail, sizeof(detail), "rewriting the header of \"%s\" failed: %s",
					 path, strerror(errno));
			close(fd);
			pool_fail("could not reuse the SSD slot file", detail, NULL);
			return false;
		}
		ereport(LOG,
				(errmsg("amrtree: SSD slot file \"%s\" belonged to a previous PMEM pool of this cluster; reusing it",
						path)));
	}
	if (h.system_identifier != GetSystemIdentifier() || h.pool_id != hdr->pool_id ||
		(hdr->ssd_file_id != 0 && h.file_id != hdr->ssd_file_id))
	{
		snprintf(detail, sizeof(detail),
				 "The slot file belongs to system identifier " UINT64_FORMAT " and pool %016llx; "
				 "this cluster is " UINT64_FORMAT " with pool %016llx.",
				 h.system_identifier, (unsigned long long) h.pool_id,
				 GetSystemIdentifier(), (unsigned long long) hdr->pool_id);
		close(fd);
		pool_fail("the SSD slot file belongs to another cluster or pool", detail,
				  "Point amrtree.ssd_path at the slot file created with this cluster's PMEM pool.");
		return false;
	}
	fstat(fd, &st);
	if ((uint64) st.st_size < (h.nslots + 1) * AMR_SLOT_SIZE)
	{
		snprintf(detail, sizeof(detail),
				 "\"%s\" is %lld bytes long but its header declares %llu slots (%llu bytes).",
				 path, (long long) st.st_size, (unsigned long long) h.nslots,
				 (unsigned long long) ((h.nslots + 1) * AMR_SLOT_SIZE));
		close(fd);
		pool_fail("the SSD slot file is truncated", detail,
				  "Restore the file from where it was copied, or move the slot file and the "
				  "PMEM pool away and restart; then REINDEX every amrtree index.");
		return false;
	}
	if (hdr->ssd_file_id == 0)
	{
		hdr->ssd_file_id = h.file_id;
		pmem_persist(&hdr->ssd_file_id, sizeof(hdr->ssd_file_id));
	}
	if (want_slots > h.nslots)
	{
		/* enlarge: slots are appended, nothing moves */
		if (posix_fallocate(fd, 0, (off_t) ((want_slots + 1) * AMR_SLOT_SIZE)) == 0)
		{
			h.nslots = want_slots;
			h.checksum = amr_ssd_header_checksum(&h);
			if (write_ssd_header(fd, &h))
				ereport(LOG, (errmsg("amrtree: enlarged SSD slot file \"%s\" to %llu slots",
									 path, (unsigned long long) want_slots)));
		}
		else
			ereport(LOG, (errmsg("amrtree: could not enlarge SSD slot file \"%s\": %m", path)));
	}
	close(fd);

	/* the descriptor every process reads and writes leaves through */
	if ((AmrSsdSync) amr_ssd_sync_setting == AMR_SSD_SYNC_DSYNC)
		flags |= O_DSYNC;
	fd = open(path, flags | O_DIRECT, 0);
	if (fd < 0)
	{
		snprintf(detail, sizeof(detail), "open(\"%s\", O_DIRECT) failed: %s", path, strerror(errno));
		pool_fail("could not open the SSD slot file for direct I/O", detail,
				  "Put amrtree.ssd_path on a file system that supports O_DIRECT (not tmpfs).");
		return false;
	}
	amr_ssd_io.fd = fd;
	amr_ssd_io.sync = (AmrSsdSync) amr_ssd_sync_setting;
	ssd_nslots = (uint32) Min(h.nslots, (uint64) AMR_MAX_SLOTS);
	snprintf(ssd_media, sizeof(ssd_media), "%s (%u slots, O_DIRECT, sync %s)", path, ssd_nslots,
			 amr_ssd_io.sync == AMR_SSD_SYNC_FDATASYNC ? "fdatasync" :
			 amr_ssd_io.sync == AMR_SSD_SYNC_DSYNC ? "O_DSYNC" : "none (not crash safe)");
	return true;
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
	*ssd_slots = Max(*ssd_slots, peek_ssd_slots(amr_ssd_path));
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
		pool_fail("amrtree.pmem_path is empty", NULL,
				  "Set amrtree.pmem_path in postgresql.conf and restart the server.");
		return;
	}
	{
		const char *why;
		const char *setting = amr_rejected_setting(&why);

		if (setting != NULL)
		{
			pool_fail(psprintf("the setting %s is not valid", setting), why,
					  "Correct it in postgresql.conf and restart the server.  "
					  "PostgreSQL ignored it and would have used the default instead.");
			return;
		}
	}

	/* the Leaf Table must cover the SSD slots too: know how many first */
	ssd_want = Min(ssd_want, (uint64) AMR_MAX_SLOTS);
	ssd_slots = Max(ssd_want, amr_ssd_path ? peek_ssd_slots(amr_ssd_path) : 0);

	if (stat(path, &st) != 0)
	{
		if (errno != ENOENT)
		{
			snprintf(detail, sizeof(detail), "stat(\"%s\") failed: %s", path, strerror(errno));
			pool_fail("could not access the PMEM pool", detail, NULL);
			return;
		}
		if (!prepare_parent_directory(path, "amrtree.pmem_path"))
			return;
		pool = pool_create(path, want, random_pool_id(), (uint64) time(NULL), ssd_slots, 0);
		if (pool == NULL)
			return;
		ereport(LOG, (errmsg("amrtree: created PMEM pool \"%s\" (%zu MB)", path, want >> 20)));
	}
	else
	{
		pool = pmemobj_open(path, AMR_POOL_LAYOUT);
		if (pool == NULL)
		{
			snprintf(detail, sizeof(detail), "pmemobj_open(\"%s\") failed: %s",
					 path, pmemobj_errormsg());
			pool_fail("could not open the PMEM pool", detail,
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
			pool = pool_create(path, want, random_pool_id(), (uint64) time(NULL), ssd_slots, 0);
			if (pool == NULL)
				return;
			hdr = pool_header(pool);
		}
		if (hdr->magic != AMR_POOL_MAGIC || hdr->format_version != AMR_FORMAT_VERSION ||
			hdr->slot_size != AMR_SLOT_SIZE)
		{
			snprintf(detail, sizeof(detail),
					 "The pool has format version %u and slot size %u; this build of amrtree uses version %u and slot size %u.",
					 hdr->format_version, hdr->slot_size, AMR_FORMAT_VERSION, AMR_SLOT_SIZE);
			pmemobj_close(pool);
			pool = NULL;
			pool_fail("the PMEM pool has an incompatible format", detail,
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
			pool_fail("the PMEM pool belongs to another cluster", detail,
					  "Point amrtree.pmem_path at this cluster's own pool, or move "
					  "the foreign file away and restart; then REINDEX every amrtree index.");
			return;
		}
		if ((st.st_size > 0 && (size_t) st.st_size < want) ||
			hdr->lt_capacity < hdr->pmem_nslots + ssd_slots)
		{
			/* a bigger pool: more PMEM slots, or a Leaf Table for more SSD slots */
			size_t		need = (size_t) st.st_size +
				(size_t) (hdr->pmem_nslots + ssd_slots - Min(hdr->lt_capacity, hdr->pmem_nslots + ssd_slots))
				* sizeof(AmrLeafTableEntry) + 2 * 1024 * 1024;
			PMEMobjpool *grown = pool_grow(pool, path, Max(want, need), ssd_slots);

			if (grown == NULL)
			{
				snprintf(detail, sizeof(detail), "%s", pmemobj_errormsg());
				pool_fail("could not reopen the PMEM pool after enlarging it", detail, NULL);
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
	else if (!ssd_open_or_create(amr_ssd_path, ssd_slots, hdr))
	{
		pmemobj_close(pool);
		pool = NULL;
		return;
	}
	/* never use more SSD slots than the Leaf Table can name */
	ssd_nslots = (uint32) Min((uint64) ssd_nslots, hdr->lt_capacity - hdr->pmem_nslots);

	amr_store.pool_base = (char *) pool;
	amr_store.header = hdr;
	amr_store.pmem_slots = (char *) pool + hdr->slots_offset;
	amr_store.pmem_nslots = (uint32) hdr->pmem_nslots;
	amr_store.lt = (AmrLeafTableEntry *) ((char *) pool + hdr->lt_offset);
	amr_store.lt_capacity = (uint32) hdr->lt_capacity;
	amr_store.tree_records = (AmrTreeRecord *) ((char *) pool + hdr->trees_offset);
	amr_store.ssd_nslots = ssd_nslots;
	choose_persistence(path, amr_store.pmem_slots,
					   (size_t) amr_store.pmem_nslots * AMR_SLOT_SIZE);
	pool_status = AMR_POOL_READY;
	ereport(LOG,
			(errmsg("amrtree: PMEM pool \"%s\": %u leaf slots of %d bytes, Leaf Table of %u entries, on %s; persisting with %s",
					path, amr_store.pmem_nslots, AMR_SLOT_SIZE, amr_store.lt_capacity,
					pool_media, amr_persist_describe())));
	if (ssd_nslots > 0)
		ereport(LOG, (errmsg("amrtree: SSD tier %s", ssd_media)));
}

void
amr_pool_describe(StringInfo buf)
{
	appendStringInfo(buf, "%s on %s, persisting with %s", amr_pool_path_display(),
					 pool_media, amr_persist_describe());
	if (ssd_nslots > 0)
		appendStringInfo(buf, "; SSD tier %s", ssd_media);
	else
		appendStringInfoString(buf, "; no SSD tier");
}

static void
compute_layout(AmrShmemLayout *l)
{
	uint32		lt = pool_status == AMR_POOL_READY ? amr_store.lt_capacity : 0;
	uint32		slots = pool_status == AMR_POOL_READY ? amr_store.pmem_nslots : 0;
	Size		off = MAXALIGN(sizeof(AmrSharedState));
	Size		node_bytes;

	l->off_tree_locks = off;
	off = CACHELINEALIGN(off + sizeof(LWLock) * AMR_MAX_TREES);
	l->off_trees = off;
	off = CACHELINEALIGN(off + sizeof(AmrTree) * AMR_MAX_TREES);
	l->off_leaf_locks = off;
	off = CACHELINEALIGN(off + sizeof(LWLock) * (Size) lt);
	l->off_leaves = off;
	off = CACHELINEALIGN(off + sizeof(AmrLeafVolatile) * (Size) lt);
	l->off_pmem_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(slots));
	l->off_ids_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(lt));
	l->off_ssd_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(pool_status == AMR_POOL_READY ? ssd_nslots : 0));

	/* DRAM copies of leaves held by rule R6, 4 KiB aligned for O_DIRECT */
	l->ncache = pool_status == AMR_POOL_READY ?
		(uint32) ((Size) amr_dram_leaf_cache_kb * 1024 / AMR_SLOT_SIZE) : 0;
	l->off_cache_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(l->ncache));
	off = TYPEALIGN(AMR_SLOT_SIZE, off);
	l->off_cache = off;
	off += (Size) l->ncache * AMR_SLOT_SIZE;

	/* clean copies of SSD leaf images (amr_ssdcache.c), 4 KiB aligned */
	l->nssd_cache = pool_status == AMR_POOL_READY && ssd_nslots > 0 ?
		amr_ssd_cache_nslots() : 0;
	l->off_ssd_cache = off;
	off += amr_ssd_cache_shmem_size(l->nssd_cache);

	/* inner nodes: amrtree.dram_size */
	node_bytes = pool_status == AMR_POOL_READY ? (Size) amr_dram_size_kb * 1024 : 0;
	l->nnodes = (uint32) Min(node_bytes / sizeof(AmrInnerNode), (Size) UINT32_MAX - 1);
	l->off_nodes_bitmap = off;
	off = CACHELINEALIGN(off + amr_bitmap_size(l->nnodes));
	l->off_nodes = off;
	off = CACHELINEALIGN(off + sizeof(AmrInnerNode) * (Size) l->nnodes);
	/* ShmemInitStruct's result is only cache-line aligned */
	l->total = off + AMR_SLOT_SIZE;
}

/*
 * A data directory that starts from a base backup (backup_label), for
 * archive recovery (recovery.signal) or as a standby (standby.signal) has a
 * history the pool did not follow: the pool is a copy taken while the heap
 * kept changing, or belongs to the server it was copied from, or to a point
 * beyond the recovery target.  Its trees cannot be trusted to match the
 * heap, so every one is dropped at the next reconciliation and its index
 * asks for REINDEX.  Checked in the postmaster before recovery starts (it
 * removes these files); recorded in the pool so that the verdict survives
 * until the reconciliation has acted on it.
 */
static void
note_history_reset(void)
{
	static const char *const markers[] = {"backup_label", "recovery.signal", "standby.signal"};
	AmrPoolHeader *hdr = amr_store.header;
	int			i;

	for (i = 0; i < lengthof(markers); i++)
	{
		char		path[MAXPGPATH];
		struct stat st;

		snprintf(path, sizeof(path), "%s/%s", DataDir, markers[i]);
		if (stat(path, &st) != 0)
			continue;
		if (hdr->history_reset == 0)
		{
			hdr->history_reset = 1;
			pmem_persist(&hdr->history_reset, sizeof(hdr->history_reset));
			if (!pmem_is_pmem(hdr, sizeof(*hdr)))
				pmem_msync(hdr, sizeof(*hdr));
		}
		ereport(LOG,
				(errmsg("amrtree: \"%s\" exists: the PMEM pool may not match this data directory's history; its amrtree indexes will need REINDEX",
						markers[i])));
		return;
	}
}

/*
 * Postmaster, pool open: if this start follows a crash (the control file
 * was not left "shut down", or the postmaster is restarting its children
 * after one), record it in the pool so that the reconciliation prunes and
 * empties unlogged trees, as PostgreSQL resets unlogged relations in the
 * same case.  See amr_note_unclean_start.
 */
static void
note_crash(bool children_crashed)
{
	bool		crc_ok = false;
	ControlFileData *cf = get_controlfile(DataDir, &crc_ok);
	bool		clean = crc_ok && (cf->state == DB_SHUTDOWNED ||
								   cf->state == DB_SHUTDOWNED_IN_RECOVERY);

	if (children_crashed || !clean)
		amr_note_unclean_start(cf->checkPoint);
	pfree(cf);
}

static void
amr_shmem_request(void)
{
	AmrShmemLayout layout;

	if (prev_shmem_request_hook)
		prev_shmem_request_hook();

	pool_open_or_create();
	if (pool_status == AMR_POOL_READY)
	{
		note_history_reset();
		note_crash(false);
	}
	compute_layout(&layout);
	RequestAddinShmemSpace(layout.total);
}

static void
amr_shmem_startup(void)
{
	AmrShmemLayout layout;
	bool		found;
	char	   *base;
	uint32		i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	compute_layout(&layout);
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	base = ShmemInitStruct("amrtree", layout.total, &found);
	/* align the whole layout so that the leaf cache is 4 KiB aligned */
	base = (char *) TYPEALIGN(AMR_SLOT_SIZE, base);
	amr_shared = (AmrSharedState *) base;
	amr_tree_locks = (LWLock *) (base + layout.off_tree_locks);
	amr_leaf_locks = (LWLock *) (base + layout.off_leaf_locks);
	amr_store.trees = (AmrTree *) (base + layout.off_trees);
	amr_store.leaves = (AmrLeafVolatile *) (base + layout.off_leaves);
	amr_store.pmem_used = (AmrBitmap *) (base + layout.off_pmem_bitmap);
	amr_store.ssd_used = ssd_nslots > 0 ? (AmrBitmap *) (base + layout.off_ssd_bitmap) : NULL;
	amr_store.ssd_nslots = pool_status == AMR_POOL_READY ? ssd_nslots : 0;
	amr_leaf_cache_used = (AmrBitmap *) (base + layout.off_cache_bitmap);
	amr_leaf_cache = (AmrLeaf *) (base + layout.off_cache);
	amr_leaf_cache_n = layout.ncache;
	amr_ssd_cache_attach(base + layout.off_ssd_cache, layout.nssd_cache, !found);
	amr_store.leaf_ids_used = (AmrBitmap *) (base + layout.off_ids_bitmap);
	amr_store.nodes_used = (AmrBitmap *) (base + layout.off_nodes_bitmap);
	amr_store.nodes = (AmrInnerNode *) (base + layout.off_nodes);
	amr_store.nnodes = layout.nnodes;

	if (!found)
	{
		uint32		lt = pool_status == AMR_POOL_READY ? amr_store.lt_capacity : 0;
		uint32		slots = pool_status == AMR_POOL_READY ? amr_store.pmem_nslots : 0;

		memset(amr_shared, 0, sizeof(AmrSharedState));
		amr_shared->tree_tranche = LWLockNewTrancheId();
		amr_shared->leaf_tranche = LWLockNewTrancheId();
		LWLockInitialize(&amr_shared->directory_lock, amr_shared->tree_tranche);
		LWLockInitialize(&amr_shared->attach_lock, amr_shared->tree_tranche);
		LWLockInitialize(&amr_shared->publish_lock, amr_shared->tree_tranche);
		ConditionVariableInit(&amr_shared->tier_cv);
		pg_atomic_init_u32(&amr_shared->attached, 0);
		pg_atomic_init_u64(&amr_shared->rebuilds, 0);
		/* a restart of the postmaster's children is always a crash */
		if (shmem_startups > 0 && pool_status == AMR_POOL_READY)
			note_crash(true);
		amr_shared->pool_id = pool_status == AMR_POOL_READY ? amr_store.header->pool_id : 0;

		for (i = 0; i < AMR_MAX_TREES; i++)
		{
			LWLockInitialize(&amr_tree_locks[i], amr_shared->tree_tranche);
			memset(&amr_store.trees[i], 0, sizeof(AmrTree));
			amr_store.trees[i].tree_no = i;
			amr_store.trees[i].root = AMR_INVALID_NODE;
			amr_store.trees[i].null_root = AMR_INVALID_NODE;
		}
		for (i = 0; i < lt; i++)
			LWLockInitialize(&amr_leaf_locks[i], amr_shared->leaf_tranche);
		memset(amr_store.leaves, 0, sizeof(AmrLeafVolatile) * (Size) lt);
		amr_bitmap_init(amr_store.pmem_used, slots);
		amr_bitmap_init(amr_store.leaf_ids_used, lt);
		amr_bitmap_init(amr_store.nodes_used, layout.nnodes);
		if (amr_store.ssd_used)
			amr_bitmap_init(amr_store.ssd_used, amr_store.ssd_nslots);
		amr_bitmap_init(amr_leaf_cache_used, layout.ncache);
	}
	LWLockRelease(AddinShmemInitLock);

	LWLockRegisterTranche(amr_shared->tree_tranche, "amrtree_tree");
	LWLockRegisterTranche(amr_shared->leaf_tranche, "amrtree_leaf");
	shmem_startups++;
}

void
amr_shmem_init_hooks(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = amr_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = amr_shmem_startup;
}

/* The pool is mapped and usable (in any process, even during recovery). */
bool
amr_pool_is_open(void)
{
	return pool_status == AMR_POOL_READY && amr_store.header != NULL;
}

/*
 * The pool is usable and this server's reconciliation has run, so the DRAM
 * tier describes it: what commit callbacks need before freeing a tree.
 */
bool
amr_is_reconciled(void)
{
	return amr_is_ready() && pg_atomic_read_u32(&amr_shared->attached) != 0;
}

bool
amr_is_ready(void)
{
	return amr_preloaded && amr_shared != NULL &&
		pool_status == AMR_POOL_READY && !RecoveryInProgress();
}

void
amr_require_ready(void)
{
	if (!amr_preloaded || amr_shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree must be loaded via shared_preload_libraries"),
				 errhint("Add amrtree to shared_preload_libraries in postgresql.conf and restart the server.")));
	if (pool_status != AMR_POOL_READY)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("amrtree PMEM pool \"%s\" is not usable: %s",
						amr_pool_path_display(), pool_error_msg),
				 pool_error_detail[0] ? errdetail("%s", pool_error_detail) : 0,
				 pool_error_hint[0] ? errhint("%s", pool_error_hint) : 0));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("amrtree indexes cannot be used during recovery"),
				 errdetail("amrtree leaves live outside the WAL, so a hot standby has none."),
				 errhint("Run the query on the primary; after promoting this server, REINDEX its amrtree indexes.")));

	if (pg_atomic_read_u32(&amr_shared->attached) != 0)
		return;
	LWLockAcquire(&amr_shared->attach_lock, LW_EXCLUSIVE);
	if (pg_atomic_read_u32(&amr_shared->attached) == 0)
	{
		amr_reconcile();
		pg_atomic_write_u32(&amr_shared->attached, 1);
	}
	LWLockRelease(&amr_shared->attach_lock);
}
