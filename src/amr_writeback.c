/*-------------------------------------------------------------------------
 *
 * amr_writeback.c
 *		Write-back pools: a pool on an ordinary disk file is used through a
 *		DRAM copy, changes reach the file in the background, and commit
 *		durability comes from amrtree's WAL records (docs/design.md,
 *		"Write-back pools").
 *
 * The postmaster maps the pool file (libpmemobj) as before, then copies it
 * into anonymous shared memory that every child inherits; amr_store points
 * at the copy.  A flush of a range of the copy (core/amr_persist.c in
 * AMR_PERSIST_HOOK mode) either marks its 4 KiB pages dirty or, when the
 * write-back worker is not armed or for the header and tree records,
 * writes them through to the file at once.  The rules that make the file
 * usable after any crash:
 *
 *	WAL before data   a page is written to the file only after the WAL
 *					  inserted before it was copied is flushed, so the file
 *					  never holds a change whose record recovery cannot
 *					  reach: it is a copy, like a base backup, and WAL
 *					  replay treats it as one (whole images first);
 *	fences			  the worker and its partner hold
 *					  DELAY_CHKPT_COMPLETE, so no checkpoint completes
 *					  until the worker has seen its redo pointer R, waited
 *					  for changes in progress, and written and synced every
 *					  dirty page: recovery, which starts at R, finds every
 *					  change whose record precedes R in the file;
 *	torn pages		  the first change of a leaf after R is logged whole, so
 *					  replay from R overwrites whatever a torn write left;
 *	extent before data
 *					  the header's WAL extent covers every page written
 *					  (wb_write_extent), so a data directory whose WAL does
 *					  not lead there can tell the file is not its own
 *					  (amr_lineage.c).
 *
 * The header records whether the file may lag the copy (writeback) and up
 * to which redo pointer it is complete (fenced_redo).  At every start, and
 * when the postmaster restarts its children after a crash, the copy is
 * loaded again from the file; a file that is not complete up to the redo
 * pointer recovery starts from (a checkpoint slipped between two fences
 * while the partner was not running: see wb_release_checkpoints) is not
 * trusted and its trees are rebuilt.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "access/twophase.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogrecovery.h"
#include "common/controldata_utils.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "port/pg_bitutils.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define WB_PAGE				4096
#define WB_WRITE_BATCH		256 /* pages copied, then written, at a time */
#define WB_POLL_MS			20	/* how soon a new redo pointer is seen */
#define WB_LOCAL_RUNS		64	/* write-through batch: page runs kept */
#define WB_PREFAULT_CHUNK	((size_t) 8 << 20)	/* populated at a time */
#define WB_PREFAULT_AHEAD	((size_t) 1 << 30)	/* kept ready past the next
												 * free slot */
#define WB_PREFAULT_STEP	8	/* chunks per wake-up at most */

bool		amr_writeback_enabled = AMR_WRITEBACK_DEFAULT;
int			amr_writeback_delay_ms = AMR_WRITEBACK_DELAY_DEFAULT_MS;

PGDLLEXPORT void amr_wb_worker_main(Datum arg);
PGDLLEXPORT void amr_wb_partner_main(Datum arg);

typedef struct AmrWbShared
{
	pg_atomic_uint32 armed;		/* the worker fences checkpoints: flushes only
								 * mark pages dirty */
	pg_atomic_uint32 fencing;	/* from arming until disarming has written
								 * everything: checkpoints need fences */
	pg_atomic_uint64 pages_written;
	pg_atomic_uint64 fences;
	pg_atomic_uint64 fenced_redo;
	uint64		npages;			/* pages of the pool file */
	uint32		nprocs;			/* change counters, by pgprocno */

	/*
	 * The partner (amr_wb_partner_main) holds checkpoints with a second vxid
	 * while the worker renews its own; each renews only when asked.
	 */
	pg_atomic_uint32 partner_holding;	/* 1 while it holds a vxid with
										 * DELAY_CHKPT_COMPLETE */
	pg_atomic_uint32 partner_asked; /* renewals the worker asked for */
	pg_atomic_uint32 partner_renewed;	/* renewals the partner made */
	pg_atomic_uint32 partner_procno;	/* its pgprocno, to wake it */
	pg_atomic_uint32 worker_procno; /* the worker's, to wake it */
	/* the WAL extent the file's header says (amr_lineage.c) */
	pg_atomic_uint32 file_extent_tli;
	pg_atomic_uint64 file_extent;
	/* then: change counters (pg_atomic_uint32), dirty bits (pg_atomic_uint64) */
} AmrWbShared;

/* Postmaster state, inherited by every child through fork(). */
static bool wb_active = false;	/* this pool is a write-back pool */
static int	wb_fd = -1;			/* the pool file, for pwrite/fdatasync */
static char *wb_copy = NULL;	/* the DRAM copy amr_store points into */
static const char *wb_file_map = NULL;	/* the file's own mapping (load) */
static size_t wb_size = 0;
static size_t wb_dirty_from = 0;	/* below: header, tree records (through) */
static size_t wb_header_off = 0;
static size_t wb_lt_off = 0;	/* the Leaf Table: [wb_lt_off, wb_lt_end) */
static size_t wb_lt_end = 0;

/* Shared state (amr_wb_shmem_attach). */
static AmrWbShared *wb_shared = NULL;
static pg_atomic_uint32 *wb_change_seq = NULL;
static pg_atomic_uint32 *wb_mark_seq = NULL;
static pg_atomic_uint64 *wb_dirty = NULL;

/* A process's write-through batch (amr_persist_batch_begin/end). */
static int	wb_batch_depth = 0;
static int	wb_batch_nruns = 0;
static uint64 wb_batch_lo[WB_LOCAL_RUNS];
static uint64 wb_batch_hi[WB_LOCAL_RUNS];

/*
 * Pages this transaction changed for an index that skips the WAL
 * (wal_level = minimal, created in this transaction): written and synced
 * before it commits, as PostgreSQL syncs such relations' files.
 */
static bool wb_wal_skipped = false;
static int	wb_skipped_nruns = 0;
static uint64 wb_skipped_lo[WB_LOCAL_RUNS];
static uint64 wb_skipped_hi[WB_LOCAL_RUNS];

static void wb_flush_hook(const void *addr, size_t len);
static void wb_batch_hook(bool begin);

/* ---- shared memory ---- */

static uint32
wb_nprocs(void)
{
	return (uint32) (MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts);
}

Size
amr_wb_shmem_size(void)
{
	Size		sz;

	if (!wb_active)
		return 0;
	sz = MAXALIGN(sizeof(AmrWbShared));
	sz = add_size(sz, MAXALIGN(mul_size(wb_nprocs(), 2 * sizeof(pg_atomic_uint32))));
	sz = add_size(sz, mul_size((wb_size / WB_PAGE + 64) / 64, sizeof(pg_atomic_uint64)));
	return sz;
}

void
amr_wb_shmem_attach(char *base, bool init)
{
	uint64		nwords;
	uint64		i;

	if (!wb_active)
		return;
	wb_shared = (AmrWbShared *) base;
	wb_change_seq = (pg_atomic_uint32 *) (base + MAXALIGN(sizeof(AmrWbShared)));
	wb_mark_seq = wb_change_seq + wb_nprocs();
	wb_dirty = (pg_atomic_uint64 *) ((char *) wb_change_seq +
									 MAXALIGN(wb_nprocs() * 2 * sizeof(pg_atomic_uint32)));
	if (!init)
		return;
	nwords = (wb_size / WB_PAGE + 64) / 64;
	pg_atomic_init_u32(&wb_shared->armed, 0);
	pg_atomic_init_u32(&wb_shared->fencing, 0);
	pg_atomic_init_u64(&wb_shared->pages_written, 0);
	pg_atomic_init_u64(&wb_shared->fences, 0);
	pg_atomic_init_u64(&wb_shared->fenced_redo, 0);
	pg_atomic_init_u32(&wb_shared->partner_holding, 0);
	pg_atomic_init_u32(&wb_shared->partner_asked, 0);
	pg_atomic_init_u32(&wb_shared->partner_renewed, 0);
	pg_atomic_init_u32(&wb_shared->partner_procno, 0);
	pg_atomic_init_u32(&wb_shared->worker_procno, 0);
	{
		const AmrPoolHeader *hdr = (const AmrPoolHeader *) (wb_copy + wb_header_off);

		pg_atomic_init_u32(&wb_shared->file_extent_tli, hdr->wal_extent_tli);
		pg_atomic_init_u64(&wb_shared->file_extent, hdr->wal_extent);
	}
	wb_shared->npages = wb_size / WB_PAGE;
	wb_shared->nprocs = wb_nprocs();
	for (i = 0; i < wb_shared->nprocs; i++)
	{
		pg_atomic_init_u32(&wb_change_seq[i], 0);
		pg_atomic_init_u32(&wb_mark_seq[i], 0);
	}
	for (i = 0; i < nwords; i++)
		pg_atomic_init_u64(&wb_dirty[i], 0);
}

/* ---- writing the file ---- */

/*
 * Write [lo, hi) of the copy (page numbers) to the file.  The caller has
 * made the WAL durable that the bytes could depend on.
 */
static void
wb_pwrite_pages(const char *src, uint64 lo, uint64 hi)
{
	size_t		len = (size_t) (hi - lo) * WB_PAGE;
	off_t		off = (off_t) lo * WB_PAGE;
	size_t		done = 0;

	if ((size_t) off >= wb_size)
		return;
	len = Min(len, wb_size - (size_t) off);
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_WRITE);
	while (done < len)
	{
		ssize_t		n = pwrite(wb_fd, src + done, len - done, off + (off_t) done);

		if (n <= 0)
		{
			pgstat_report_wait_end();
			if (n == 0)
				errno = ENOSPC;
			ereport(IsUnderPostmaster ? ERROR : LOG,
					(errcode_for_file_access(),
					 errmsg("could not write to amrtree pool \"%s\": %m",
							amr_pool_path_display()),
					 errdetail("Writing %zu bytes at offset %lld.",
							   len - done, (long long) (off + (off_t) done))));
			return;
		}
		done += (size_t) n;
	}
	pgstat_report_wait_end();
}

static void
wb_fdatasync(void)
{
	pgstat_report_wait_start(WAIT_EVENT_DATA_FILE_SYNC);
	if (fdatasync(wb_fd) != 0)
	{
		pgstat_report_wait_end();
		/* as PostgreSQL does for its own files: a failed sync may lose data */
		ereport(IsUnderPostmaster ? data_sync_elevel(ERROR) : LOG,
				(errcode_for_file_access(),
				 errmsg("could not fsync amrtree pool \"%s\": %m",
						amr_pool_path_display())));
		return;
	}
	pgstat_report_wait_end();
}

/*
 * Bring the file's header up to the WAL extent of the copy before a page
 * that may hold a change it covers is written (amr_lineage.c): the file
 * never holds a change from beyond the extent its header states.  With
 * "sync", durably first, so that no crash can keep the page and lose the
 * header; replay (sync = false) writes everything into the page cache and
 * syncs it in its own rhythm.
 */
static void
wb_write_extent(bool sync)
{
	const AmrPoolHeader *hdr = (const AmrPoolHeader *) (wb_copy + wb_header_off);
	uint32		tli;
	uint64		extent;

	if (wb_shared == NULL || amr_shared == NULL)
		return;
	SpinLockAcquire(&amr_shared->lineage_mutex);
	tli = hdr->wal_extent_tli;
	extent = hdr->wal_extent;
	SpinLockRelease(&amr_shared->lineage_mutex);
	if (tli == pg_atomic_read_u32(&wb_shared->file_extent_tli) &&
		extent <= pg_atomic_read_u64(&wb_shared->file_extent))
		return;
	wb_pwrite_pages(wb_copy + (wb_header_off / WB_PAGE) * WB_PAGE, wb_header_off / WB_PAGE,
					(wb_header_off + sizeof(AmrPoolHeader) + WB_PAGE - 1) / WB_PAGE);
	if (sync)
		wb_fdatasync();
	/* a racing writer may store an older value: that costs one more write */
	pg_atomic_write_u32(&wb_shared->file_extent_tli, tli);
	pg_atomic_write_u64(&wb_shared->file_extent, extent);
}

/*
 * Make every WAL record inserted so far durable, and the file's WAL extent
 * cover them, before pages of the copy are written (not in the postmaster
 * or during recovery).
 */
static void
wb_flush_wal(void)
{
	if (!IsUnderPostmaster || RecoveryInProgress())
		return;
	XLogFlush(amr_insert_lsn());
	wb_write_extent(true);
}

/*
 * Write n pages copied into buf (pages[i], ascending, at buf + i pages) to
 * the file, consecutive ones with one write, after making the WAL their
 * changes could depend on durable.
 */
static void
wb_write_copied(const char *buf, const uint64 *pages, int n)
{
	int			i = 0;

	wb_flush_wal();
	while (i < n)
	{
		int			j = i + 1;

		while (j < n && pages[j] == pages[j - 1] + 1)
			j++;
		wb_pwrite_pages(buf + (size_t) i * WB_PAGE, pages[i], pages[j - 1] + 1);
		i = j;
	}
}

/* Write page runs of the copy through to the file, synced. */
static void
wb_write_through_runs(const uint64 *lo, const uint64 *hi, int n)
{
	int			i;

	wb_flush_wal();
	for (i = 0; i < n; i++)
		wb_pwrite_pages(wb_copy + lo[i] * WB_PAGE, lo[i], hi[i]);
	wb_fdatasync();
}

static void
wb_write_through(size_t off, size_t len)
{
	uint64		lo = off / WB_PAGE;
	uint64		hi = (off + len + WB_PAGE - 1) / WB_PAGE;

	wb_write_through_runs(&lo, &hi, 1);
}

static void
wb_write_header(void)
{
	wb_write_through(wb_header_off, sizeof(AmrPoolHeader));
}

static void
wb_mark_dirty(size_t off, size_t len)
{
	uint64		p = off / WB_PAGE;
	uint64		last = (off + len - 1) / WB_PAGE;

	for (; p <= last; p++)
	{
		pg_atomic_uint64 *w = &wb_dirty[p >> 6];
		uint64		bit = UINT64CONST(1) << (p & 63);

		if ((pg_atomic_read_u64(w) & bit) == 0)
			pg_atomic_fetch_or_u64(w, bit);
	}
}

/* ---- during recovery ---- */

/*
 * WAL replay (crash recovery, a standby) writes each change through to the
 * file at once but syncs it only every WB_RECOVERY_SYNC_MS and at the end
 * of recovery: a sync per change would make a standby on a disk pool fall
 * behind a primary that writes back.  No checkpoint fence is possible here
 * (restartpoints wait for nobody), so the header says how the file may be
 * incomplete: writeback = AMR_WB_RECOVERY, fenced_redo = the replay
 * position of the last sync, boot = this boot.  A later start trusts the
 * file if the machine did not reboot since (the page cache kept every
 * write) or if the last sync covers the redo pointer recovery starts from.
 */
#define WB_RECOVERY_SYNC_MS	1000

static TimestampTz wb_recovery_synced_at = 0;
static bool wb_recovery_marked = false;

static uint64
wb_boot_tag(void)
{
	char		id[64] = {0};
	FILE	   *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	uint64		tag = 0;
	int			i;

	if (f == NULL)
		return 0;
	if (fgets(id, sizeof(id), f) == NULL)
		id[0] = '\0';
	fclose(f);
	/* FNV-1a: any stable 64-bit digest of the boot's id will do */
	tag = UINT64CONST(0xcbf29ce484222325);
	for (i = 0; id[i] != '\0' && id[i] != '\n'; i++)
		tag = (tag ^ (unsigned char) id[i]) * UINT64CONST(0x100000001b3);
	return tag;
}

static void
wb_recovery_sync(void)
{
	AmrPoolHeader *hdr = (AmrPoolHeader *) (wb_copy + wb_header_off);
	XLogRecPtr	replayed = GetXLogReplayRecPtr(NULL);

	wb_fdatasync();
	hdr->fenced_redo = replayed;
	wb_pwrite_pages(wb_copy + (wb_header_off / WB_PAGE) * WB_PAGE, wb_header_off / WB_PAGE,
					(wb_header_off + sizeof(AmrPoolHeader) + WB_PAGE - 1) / WB_PAGE);
	wb_fdatasync();
	wb_recovery_synced_at = GetCurrentTimestamp();
}

static void
wb_recovery_write(size_t off, size_t len)
{
	if (!wb_recovery_marked)
	{
		AmrPoolHeader *hdr = (AmrPoolHeader *) (wb_copy + wb_header_off);

		hdr->writeback = AMR_WB_RECOVERY;
		hdr->boot = wb_boot_tag();
		hdr->fenced_redo = GetXLogReplayRecPtr(NULL);
		wb_write_through(wb_header_off, sizeof(AmrPoolHeader));
		wb_recovery_marked = true;
		wb_recovery_synced_at = GetCurrentTimestamp();
	}
	wb_write_extent(false);
	wb_pwrite_pages(wb_copy + (off / WB_PAGE) * WB_PAGE, off / WB_PAGE,
					(off + len + WB_PAGE - 1) / WB_PAGE);
	if (TimestampDifferenceExceeds(wb_recovery_synced_at, GetCurrentTimestamp(),
								   WB_RECOVERY_SYNC_MS))
		wb_recovery_sync();
}

/*
 * The startup process exits during recovery (a standby's clean shutdown):
 * sync the file and record that it is complete up to the replay position
 * (AMR_WB_STOPPED).  The shutdown restartpoint that follows has its redo
 * pointer before that position, so the next start finds the file complete
 * up to where replay resumes without the same-boot trust of
 * AMR_WB_RECOVERY, which would also take an older copy of the file, put
 * back while the server was stopped, for the file replay wrote (wb_load).
 * An immediate stop or a crash skips this and keeps that trust.
 */
static void
wb_recovery_at_exit(int code, Datum arg)
{
	AmrPoolHeader *hdr;

	/* after the end of recovery the file is complete (amr_wb_recovery_done) */
	if (!wb_active || wb_copy == NULL || !RecoveryInProgress())
		return;
	hdr = (AmrPoolHeader *) (wb_copy + wb_header_off);

	/*
	 * Also when replay wrote nothing since the start: the header then says
	 * complete, which a start cannot check against the redo pointer, so an
	 * older copy of the file saying the same would pass.
	 */
	hdr->writeback = AMR_WB_STOPPED;
	hdr->boot = 0;
	wb_recovery_sync();
}

void
amr_wb_recovery_register_exit(void)
{
	static bool registered = false;

	if (wb_active && !registered)
	{
		before_shmem_exit(wb_recovery_at_exit, (Datum) 0);
		registered = true;
	}
}

void
amr_wb_recovery_done(void)
{
	AmrPoolHeader *hdr;

	if (!wb_active || !wb_recovery_marked)
		return;
	hdr = (AmrPoolHeader *) (wb_copy + wb_header_off);
	wb_fdatasync();
	hdr->writeback = AMR_WB_COMPLETE;
	wb_write_through(wb_header_off, sizeof(AmrPoolHeader));
	wb_recovery_marked = false;
}

/* ---- changes that skip the WAL ---- */

static bool
wb_in_leaf_table(size_t off)
{
	return off >= wb_lt_off && off < wb_lt_end;
}

static void
wb_skipped_write(void)
{
	int			i;

	wb_flush_wal();
	for (i = 0; i < wb_skipped_nruns; i++)
		wb_pwrite_pages(wb_copy + wb_skipped_lo[i] * WB_PAGE, wb_skipped_lo[i], wb_skipped_hi[i]);
	wb_skipped_nruns = 0;
}

static void
wb_skipped_add(uint64 lo, uint64 hi)
{
	int			i;

	for (i = 0; i < wb_skipped_nruns; i++)
	{
		if (lo <= wb_skipped_hi[i] && hi >= wb_skipped_lo[i])
		{
			wb_skipped_lo[i] = Min(lo, wb_skipped_lo[i]);
			wb_skipped_hi[i] = Max(hi, wb_skipped_hi[i]);
			return;
		}
	}
	/* full: write what is collected now (into the page cache), sync at commit */
	if (wb_skipped_nruns == WB_LOCAL_RUNS)
		wb_skipped_write();
	wb_skipped_lo[wb_skipped_nruns] = lo;
	wb_skipped_hi[wb_skipped_nruns] = hi;
	wb_skipped_nruns++;
}

void
amr_wb_note_wal_skipped(void)
{
	if (wb_active)
		wb_wal_skipped = true;
}

/*
 * Write every dirty page of the Leaf Table, as the worker writes pages:
 * copied first, then the WAL flushed, then written, so that no change in
 * them lacks a durable record.  The caller holds writeback_lock, so no
 * copy the worker took earlier can land on a page after us: after this
 * (and a sync) the file's Leaf Table is at least as new as the copy's was
 * when we began.
 *
 * Why a transaction that skips the WAL needs it: the slots and leaf ids it
 * takes may have been freed by logged changes of other leaves (a split, a
 * rewrite, a move, a drop) whose Leaf Table pages only the copy holds yet;
 * replay would bring them up to date, but only after attach has decided
 * from the file which leaf owns which slot.  Two leaves naming one slot
 * there, the one of the tree no WAL can restore was taken for the stale
 * one (the later leaf id loses), and its index was lost.  Once the file
 * holds the frees, every slot this transaction's leaves name is theirs
 * alone in the file, as in the copy.
 */
static void
wb_write_leaf_table(void)
{
	uint64		first = wb_lt_off / WB_PAGE;
	uint64		end = (wb_lt_end + WB_PAGE - 1) / WB_PAGE;
	uint64		pages[WB_WRITE_BATCH];
	char	   *buf = NULL;
	uint64		p = first;

	while (p < end)
	{
		int			n = 0;

		for (; p < end && n < WB_WRITE_BATCH; p++)
		{
			if ((pg_atomic_read_u64(&wb_dirty[p >> 6]) & (UINT64CONST(1) << (p & 63))) == 0)
				continue;
			/* the bit stays set: the worker writes the page again, harmlessly */
			if (buf == NULL)
				buf = palloc((Size) WB_WRITE_BATCH * WB_PAGE);
			pages[n] = p;
			memcpy(buf + (size_t) n * WB_PAGE, wb_copy + p * WB_PAGE, WB_PAGE);
			n++;
		}
		if (n == 0)
			break;
		wb_write_copied(buf, pages, n);
	}
	if (buf != NULL)
		pfree(buf);
}

void
amr_wb_pre_commit(void)
{
	if (!wb_wal_skipped)
		return;

	/*
	 * Exclusive of the worker's writes: a page it copied before our changes
	 * (a slot of ours holding another leaf's image, a Leaf Table page without
	 * the free of a slot we took) and wrote after ours would undo them in the
	 * file.  A page the worker takes after this copies the copy as it is
	 * then, ours included.
	 */
	if (wb_shared == NULL)
		wb_skipped_write();
	else
	{
		LWLockAcquire(&amr_shared->writeback_lock, LW_EXCLUSIVE);
		wb_skipped_write();
		wb_write_leaf_table();
		LWLockRelease(&amr_shared->writeback_lock);
	}
	wb_fdatasync();
	wb_wal_skipped = false;
}

void
amr_wb_end_of_xact(void)
{
	wb_wal_skipped = false;
	wb_skipped_nruns = 0;
}

/* ---- the persist hook ---- */

static void
wb_batch_add(uint64 lo, uint64 hi)
{
	int			i;

	for (i = 0; i < wb_batch_nruns; i++)
	{
		if (lo <= wb_batch_hi[i] && hi >= wb_batch_lo[i])
		{
			wb_batch_lo[i] = Min(lo, wb_batch_lo[i]);
			wb_batch_hi[i] = Max(hi, wb_batch_hi[i]);
			return;
		}
	}
	if (wb_batch_nruns == WB_LOCAL_RUNS)
	{
		/* full: what is collected may reach the file now (order is free) */
		wb_write_through_runs(wb_batch_lo, wb_batch_hi, wb_batch_nruns);
		wb_batch_nruns = 0;
	}
	wb_batch_lo[wb_batch_nruns] = lo;
	wb_batch_hi[wb_batch_nruns] = hi;
	wb_batch_nruns++;
}

/*
 * Every persist of the copy comes here.  Leaf Table and slot pages are
 * only marked dirty while the worker is armed: their changes are logged
 * (or need no log, see docs/design.md), and the fence writes them before
 * any checkpoint that follows their records completes.  Everything else --
 * the header and tree records, whose commit protocols assume a durable
 * store, and every store made while nobody fences -- is written through.
 */
static void
wb_flush_hook(const void *addr, size_t len)
{
	size_t		off = (size_t) ((const char *) addr - wb_copy);

	if (len == 0 || off >= wb_size)
		return;
	len = Min(len, wb_size - off);
	if (wb_shared != NULL && off >= wb_dirty_from && MyProc != NULL)
	{
		pg_atomic_uint32 *seq = &wb_mark_seq[MyProc->pgprocno];
		bool		marked = false;

		/*
		 * Odd while we decide and mark, so that a disarming worker, which
		 * waits for odd counters after it cleared armed, writes this page
		 * (see wb_disarm): not every store here is inside a logged change.
		 */
		pg_atomic_fetch_add_u32(seq, 1);
		if (pg_atomic_read_u32(&wb_shared->armed) != 0)
		{
			wb_mark_dirty(off, len);
			marked = true;
		}

		/*
		 * No record: neither replay nor a fence covers it, the commit must.
		 * Its slots are its own and written from the copy; the Leaf Table,
		 * shared with every other leaf, is written at commit as the worker
		 * writes it (wb_write_leaf_table): written from the copy after a WAL
		 * flush, another backend's change landing in between could reach the
		 * file before its record.
		 */
		if (marked && wb_wal_skipped && !wb_in_leaf_table(off))
			wb_skipped_add(off / WB_PAGE, (off + len + WB_PAGE - 1) / WB_PAGE);
		pg_atomic_fetch_add_u32(seq, 1);
		if (marked)
			return;
	}
	if (IsUnderPostmaster && RecoveryInProgress())
	{
		wb_recovery_write(off, len);
		return;
	}
	if (wb_batch_depth > 0)
	{
		wb_batch_add(off / WB_PAGE, (off + len + WB_PAGE - 1) / WB_PAGE);
		return;
	}
	wb_write_through(off, len);
}

static void
wb_batch_hook(bool begin)
{
	if (begin)
	{
		if (wb_batch_depth++ == 0)
			wb_batch_nruns = 0;
		return;
	}
	Assert(wb_batch_depth > 0);
	if (--wb_batch_depth > 0 || wb_batch_nruns == 0)
		return;
	wb_write_through_runs(wb_batch_lo, wb_batch_hi, wb_batch_nruns);
	wb_batch_nruns = 0;
}

/* ---- changes in progress ---- */

void
amr_wb_change_begin(void)
{
	if (wb_change_seq != NULL && MyProc != NULL)
		pg_atomic_fetch_add_u32(&wb_change_seq[MyProc->pgprocno], 1);
}

void
amr_wb_change_end(void)
{
	if (wb_change_seq != NULL && MyProc != NULL)
		pg_atomic_fetch_add_u32(&wb_change_seq[MyProc->pgprocno], 1);
}

/*
 * Wait until every logged change that was in progress when we looked has
 * been made and its pages marked (the counter of a process is odd between
 * amr_wb_change_begin and _end).  Changes that begin later insert their
 * records after whatever redo pointer the caller read before calling.
 */
static void
wb_wait_for_odd(pg_atomic_uint32 *counters)
{
	uint32		n = wb_shared->nprocs;
	uint32	   *seen = palloc(sizeof(uint32) * n);
	uint32		i;

	pg_memory_barrier();
	for (i = 0; i < n; i++)
		seen[i] = pg_atomic_read_u32(&counters[i]);
	for (i = 0; i < n; i++)
	{
		while ((seen[i] & 1) != 0 && pg_atomic_read_u32(&counters[i]) == seen[i])
		{
			CHECK_FOR_INTERRUPTS();
			pg_usleep(100L);
		}
	}
	pfree(seen);
}

static void
wb_wait_for_changes_in_progress(void)
{
	wb_wait_for_odd(wb_change_seq);
}

/* ---- the worker ---- */

/*
 * The worker's pages taken off the dirty bitmap and not yet written: if a
 * write fails they are marked dirty again (wb_restore_taken), or the file
 * would miss them for good -- the exit path (wb_disarm) and the next
 * worker, finding nothing dirty, would record the file complete, and a
 * later start would load it and lose their changes.  Kept dirty, they
 * hold off every checkpoint (the partner keeps fencing) until a worker
 * has written them.
 */
static uint64 wb_taken[WB_WRITE_BATCH];
static int	wb_ntaken = 0;

/*
 * Mark the pages taken and not written dirty again.  Run where the worker
 * ends up after a failed write: wb_disarm, after an error, and (a failure
 * in wb_disarm itself is FATAL and exits without unwinding) an exit
 * callback that runs after it.
 */
static void
wb_restore_taken(void)
{
	int			i;

	if (wb_shared == NULL)
		return;
	for (i = 0; i < wb_ntaken; i++)
		wb_mark_dirty((size_t) wb_taken[i] * WB_PAGE, WB_PAGE);
	wb_ntaken = 0;
}

static void
wb_restore_taken_at_exit(int code, Datum arg)
{
	wb_restore_taken();
}

/* Whether any page of the pool is marked dirty. */
static bool
wb_any_dirty(void)
{
	uint64		nwords = (wb_shared->npages + 64) / 64;
	uint64		w;

	for (w = 0; w < nwords; w++)
		if (pg_atomic_read_u64(&wb_dirty[w]) != 0)
			return true;
	return false;
}

static void
wb_write_dirty_context(void *arg)
{
	errcontext("writing back %d dirty pages of the pool (they stay dirty, to be written again when the write-back worker restarts)",
			   wb_ntaken);
}

/*
 * Write every dirty page: clear its bit, copy it, make the WAL inserted
 * so far durable, then write the copies.  A change that lands in a page
 * after its copy marks it again; one caught half-way in the copy has its
 * record inserted before the copy began, so the flush covers it.
 *
 * Pages are taken off the bitmap a whole word at a time, as many words as
 * fit in a batch, so that every page taken and not yet written is in
 * wb_taken when a write fails.
 *
 * Under writeback_lock, which a commit that skipped the WAL takes to
 * write its pages (amr_wb_pre_commit): a copy taken here before that
 * commit's changes must not reach the file after them.  The lock also
 * holds interrupts off, so a shutdown cannot stop us with pages taken off
 * the bitmap and not written.
 */
static void
wb_write_dirty(char *buf)
{
	uint64		nwords = (wb_shared->npages + 64) / 64;
	uint64		w = 0;
	ErrorContextCallback errcallback;

	Assert(wb_ntaken == 0);
	errcallback.callback = wb_write_dirty_context;
	errcallback.arg = NULL;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	LWLockAcquire(&amr_shared->writeback_lock, LW_EXCLUSIVE);
	while (w < nwords)
	{
		for (; w < nwords && wb_ntaken <= WB_WRITE_BATCH - 64; w++)
		{
			uint64		bits;

			if (pg_atomic_read_u64(&wb_dirty[w]) == 0)
				continue;
			bits = pg_atomic_exchange_u64(&wb_dirty[w], 0);
			while (bits != 0)
			{
				uint64		p = w * 64 + (uint64) pg_rightmost_one_pos64(bits);

				bits &= bits - 1;
				memcpy(buf + (size_t) wb_ntaken * WB_PAGE, wb_copy + p * WB_PAGE, WB_PAGE);
				wb_taken[wb_ntaken++] = p;
			}
		}
		if (wb_ntaken == 0)
			break;
		wb_write_copied(buf, wb_taken, wb_ntaken);
		pg_atomic_fetch_add_u64(&wb_shared->pages_written, (uint64) wb_ntaken);
		wb_ntaken = 0;
	}
	LWLockRelease(&amr_shared->writeback_lock);
	error_context_stack = errcallback.previous;
}

/*
 * The fence for redo pointer R: afterwards the file holds every change
 * whose record lies before R, and says so.
 */
static void
wb_fence(char *buf, XLogRecPtr redo)
{
	AmrPoolHeader *hdr = amr_store.header;

	wb_wait_for_changes_in_progress();
	wb_write_dirty(buf);
	wb_fdatasync();
	hdr->fenced_redo = redo;
	hdr->writeback = AMR_WB_FENCED;
	wb_write_header();
	pg_atomic_write_u64(&wb_shared->fenced_redo, redo);
	pg_atomic_fetch_add_u64(&wb_shared->fences, 1);
}

/*
 * Begin a transaction that holds checkpoints: the checkpointer, after
 * writing its buffers, waits for every vxid it then sees with
 * DELAY_CHKPT_COMPLETE.  The barrier orders the flag and the vxid before
 * whatever the caller looks at or announces next.
 */
static void
wb_hold_checkpoints(void)
{
	StartTransactionCommand();
	MyProc->delayChkptFlags |= DELAY_CHKPT_COMPLETE;
	pg_memory_barrier();
}

/* Remember this process as *procno, for wb_wake. */
static void
wb_set_procno(pg_atomic_uint32 *procno)
{
	pg_atomic_write_u32(procno, (uint32) MyProc->pgprocno + 1);
}

/* Wake the process remembered in *procno, if there is one. */
static void
wb_wake(pg_atomic_uint32 *procno)
{
	uint32		n = pg_atomic_read_u32(procno);

	if (n != 0)
		SetLatch(&ProcGlobal->allProcs[n - 1].procLatch);
}

/*
 * The start of the worker and of its partner: signals, a backend id for
 * transactions (the checkpointer waits on a vxid), and where to wake the
 * process.  Exits at once if the pool is not written back.
 */
static void
wb_process_start(bool partner)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	if (!wb_active || wb_shared == NULL)
		proc_exit(0);			/* exit code 0: not started again */

	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);
	wb_set_procno(partner ? &wb_shared->partner_procno : &wb_shared->worker_procno);
}

/*
 * Let a checkpoint that waits on the worker go; the caller has seen that
 * its redo pointer is fenced.  The checkpointer waits on the vxids it saw,
 * so a new vxid releases it.  Between ending one transaction and beginning
 * the next the worker holds none, and a checkpoint that fixed its redo
 * pointer after the worker's look and looked for holders in that instant
 * would complete unfenced: a base backup taken then gets a pool it cannot
 * use.  So the partner holds a second vxid, and the two are renewed in
 * turn, each renewal after a fresh look at the redo pointer.  Whenever a
 * checkpoint looks for holders it finds at least one, and at most one of
 * those it finds is renewed on a look older than its redo pointer: the
 * other's renewal comes after the first one, hence after the
 * checkpoint's look, sees its redo pointer, and waits for its fence
 * (docs/design.md, "Fences").  Without the partner (not started yet, or
 * restarting after a crash) the instant is back, and is handled as before:
 * detected at start, healed by rebuilding.
 */
static void
wb_release_checkpoints(XLogRecPtr fenced)
{
	bool		partnered = pg_atomic_read_u32(&wb_shared->partner_holding) != 0;
	uint32		asked;

	CommitTransactionCommand();
	AMR_FAULT_POINT("writeback:between_vxids");
	wb_hold_checkpoints();
	if (!partnered || GetRedoRecPtr() != fenced)
		return;					/* a new checkpoint: fence it first */

	asked = pg_atomic_add_fetch_u32(&wb_shared->partner_asked, 1);
	wb_wake(&wb_shared->partner_procno);
	while (pg_atomic_read_u32(&wb_shared->partner_renewed) != asked &&
		   pg_atomic_read_u32(&wb_shared->partner_holding) != 0)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 WB_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Keep the copy's pages populated up to WB_PREFAULT_AHEAD past where new
 * PMEM slots are taken (the slot bitmap's next-fit hint), so that a build
 * or a burst of splits stores into resident memory instead of taking a
 * page fault per 4 kB of fresh shared memory.  On virtual machines a first
 * touch also faults in the hypervisor: at 10M rows these faults were 13-21 %
 * of a build's time, on its critical path, while this worker's CPU idled.
 * Populating never changes a page's contents, so it races with nothing.
 * The copy grows by at most WB_PREFAULT_AHEAD beyond the slots in use;
 * populated chunks are remembered (they stay resident).  Returns whether
 * there is more to do at once.
 */
static bool
wb_prefault_ahead(void)
{
	static bool *populated = NULL;
	static bool disabled = false;
	AmrBitmap  *used = amr_store.pmem_used;
	size_t		slots_base;
	size_t		area;
	size_t		next;
	size_t		ahead;
	int			done = 0;

	if (disabled || used == NULL || used->nbits == 0)
		return false;
	slots_base = (size_t) (amr_store.pmem_slots - wb_copy);
	area = (size_t) used->nbits * AMR_SLOT_SIZE;
	if (populated == NULL)
		populated = MemoryContextAllocZero(TopMemoryContext,
										   (area + WB_PREFAULT_CHUNK - 1) / WB_PREFAULT_CHUNK);
	next = (size_t) (__atomic_load_n(&used->hint, __ATOMIC_RELAXED) * 64) * AMR_SLOT_SIZE;
	for (ahead = 0; ahead < Min(area, WB_PREFAULT_AHEAD); ahead += WB_PREFAULT_CHUNK)
	{
		size_t		c = ((next + ahead) % area) / WB_PREFAULT_CHUNK;
		size_t		off = c * WB_PREFAULT_CHUNK;

		if (populated[c])
			continue;
		if (done == WB_PREFAULT_STEP)
			return true;
		if (madvise(wb_copy + slots_base + off, Min(WB_PREFAULT_CHUNK, area - off),
					MADV_POPULATE_WRITE) != 0)
		{
			/* an older kernel, or memory is short: stores fault as before */
			ereport(DEBUG1,
					(errmsg_internal("amrtree: stopped populating the write-back copy ahead: %m")));
			disabled = true;
			return false;
		}
		populated[c] = true;
		done++;
	}
	return false;
}

/*
 * Stop fencing: from now on every flush writes through; then write what
 * is dirty and record that the file holds every change.  Also run when
 * the worker exits on an error, so that a clean shutdown, which stops the
 * worker before its checkpoint, leaves a complete file.
 */
static void
wb_disarm(int code, Datum arg)
{
	char	   *buf = (char *) DatumGetPointer(arg);

	/* an error in wb_write_dirty exits here with the lock still ours */
	if (amr_shared != NULL && LWLockHeldByMe(&amr_shared->writeback_lock))
		LWLockRelease(&amr_shared->writeback_lock);
	/* and with the pages it had taken not written: write them below */
	wb_restore_taken();
	if (wb_shared == NULL || pg_atomic_read_u32(&wb_shared->armed) == 0)
		return;
	/* we may be exiting on a termination request: do not act on it again */
	HOLD_INTERRUPTS();
	pg_atomic_write_u32(&wb_shared->armed, 0);
	/* logged changes under way, and stores that found us armed */
	wb_wait_for_changes_in_progress();
	wb_wait_for_odd(wb_mark_seq);
	wb_write_dirty(buf);
	wb_fdatasync();
	amr_store.header->writeback = AMR_WB_COMPLETE;
	wb_write_header();
	/* the file is complete: the partner may let checkpoints go */
	pg_atomic_write_u32(&wb_shared->fencing, 0);
	wb_wake(&wb_shared->partner_procno);
	RESUME_INTERRUPTS();
}

void
amr_wb_worker_main(Datum arg)
{
	char	   *buf;
	XLogRecPtr	fenced;
	TimestampTz last_write = 0;
	bool		more_to_populate = false;

	wb_process_start(false);
	buf = MemoryContextAlloc(TopMemoryContext, (Size) WB_WRITE_BATCH * WB_PAGE);
	/* runs after wb_disarm, also when a failed write ends it (FATAL) */
	before_shmem_exit(wb_restore_taken_at_exit, (Datum) 0);
	before_shmem_exit(wb_disarm, PointerGetDatum(buf));

	/*
	 * Arm: until now every flush wrote through, so the file is complete up to
	 * the current redo pointer; say so before the first flush that only marks
	 * a page, then fence once more for changes that raced the switch.
	 */
	wb_hold_checkpoints();
	fenced = GetRedoRecPtr();

	/*
	 * Unless a worker before us failed to write some pages (they are still
	 * marked): then the file is complete only up to that worker's last fence,
	 * which the header still says, until our first fence succeeds.
	 */
	if (!wb_any_dirty())
		amr_store.header->fenced_redo = fenced;
	amr_store.header->writeback = AMR_WB_FENCED;
	wb_write_header();
	pg_atomic_write_u32(&wb_shared->fencing, 1);
	pg_atomic_write_u32(&wb_shared->armed, 1);
	wb_wake(&wb_shared->partner_procno);
	wb_fence(buf, fenced);
	ereport(LOG,
			(errmsg("amrtree: write-back of pool \"%s\" started", amr_pool_path_display()),
			 errdetail("Changes reach the file in the background; commits are durable through the WAL.")));

	for (;;)
	{
		XLogRecPtr	redo;

		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 more_to_populate ? 0 : WB_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		more_to_populate = wb_prefault_ahead();

		/* a checkpoint began: it completes only after this fence */
		redo = GetRedoRecPtr();
		if (redo != fenced)
		{
			wb_fence(buf, redo);
			fenced = redo;
		}
		else if (TimestampDifferenceExceeds(last_write, GetCurrentTimestamp(),
											amr_writeback_delay_ms))
		{
			wb_write_dirty(buf);
			last_write = GetCurrentTimestamp();
		}

		/* a checkpoint that waits on us may go once its redo is fenced */
		if (GetRedoRecPtr() == fenced)
			wb_release_checkpoints(fenced);
	}
}

static void
wb_partner_leave(int code, Datum arg)
{
	if (wb_shared == NULL)
		return;
	pg_atomic_write_u32(&wb_shared->partner_holding, 0);
	pg_atomic_write_u32(&wb_shared->partner_procno, 0);
	pg_memory_barrier();
	wb_wake(&wb_shared->worker_procno);
}

/*
 * The write-back worker's partner: while the worker fences, holds
 * checkpoints with a vxid of its own, renewed only when the worker asks
 * (wb_release_checkpoints).  Before the worker arms, and once it has
 * disarmed (stopped by an error or a termination request, after writing
 * everything), flushes write through and nothing needs a fence: it holds
 * none.
 */
void
amr_wb_partner_main(Datum arg)
{
	bool		holding = false;

	wb_process_start(true);
	before_shmem_exit(wb_partner_leave, (Datum) 0);

	for (;;)
	{
		uint32		asked = pg_atomic_read_u32(&wb_shared->partner_asked);
		bool		fencing = pg_atomic_read_u32(&wb_shared->fencing) != 0;

		if (holding && !fencing)
		{
			pg_atomic_write_u32(&wb_shared->partner_holding, 0);
			CommitTransactionCommand();
			holding = false;
		}
		else if (!holding && fencing)
		{
			/* the worker asks nothing while we do not hold */
			wb_hold_checkpoints();
			pg_atomic_write_u32(&wb_shared->partner_renewed, asked);
			pg_memory_barrier();
			pg_atomic_write_u32(&wb_shared->partner_holding, 1);
			holding = true;
		}
		else if (holding && asked != pg_atomic_read_u32(&wb_shared->partner_renewed))
		{
			/* partner_holding stays 1: the worker waits for the new vxid */
			CommitTransactionCommand();
			wb_hold_checkpoints();
			pg_atomic_write_u32(&wb_shared->partner_renewed, asked);
			wb_wake(&wb_shared->worker_procno);
		}

		/* the timeout only covers a wake-up lost to a worker's restart */
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

void
amr_wb_register_worker(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	snprintf(worker.bgw_name, BGW_MAXLEN, "amrtree write-back");
	snprintf(worker.bgw_type, BGW_MAXLEN, "amrtree write-back");
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "amrtree");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "amr_wb_worker_main");
	RegisterBackgroundWorker(&worker);

	snprintf(worker.bgw_name, BGW_MAXLEN, "amrtree write-back partner");
	snprintf(worker.bgw_type, BGW_MAXLEN, "amrtree write-back partner");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "amr_wb_partner_main");
	RegisterBackgroundWorker(&worker);
}

/* ---- the postmaster: the copy ---- */

/* The redo pointer recovery will start from: the backup's, else the control file's. */
static XLogRecPtr
wb_recovery_start(void)
{
	char		path[MAXPGPATH];
	FILE	   *f;
	bool		crc_ok = false;
	ControlFileData *cf;
	XLogRecPtr	redo = InvalidXLogRecPtr;

	snprintf(path, sizeof(path), "%s/backup_label", DataDir);
	f = fopen(path, "r");
	if (f != NULL)
	{
		char		line[MAXPGPATH];
		uint32		hi,
					lo;

		while (fgets(line, sizeof(line), f) != NULL)
			if (sscanf(line, "START WAL LOCATION: %X/%X", &hi, &lo) == 2)
				redo = ((uint64) hi << 32) | lo;
		fclose(f);
		if (redo != InvalidXLogRecPtr)
			return redo;
	}
	cf = get_controlfile(DataDir, &crc_ok);
	if (crc_ok)
		redo = cf->checkPointCopy.redo;
	pfree(cf);
	return redo;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23	/* Linux 5.14 */
#endif

/*
 * Copy [off, off+len) of the file into the copy: the destination populated
 * in one call, the source read with pread (no page faults on the file's
 * mapping).
 */
static void
wb_load_range(size_t off, size_t len)
{
	size_t		done = 0;

	/* older kernels refuse the advice: the copy then faults page by page */
	(void) madvise(wb_copy + off, len, MADV_POPULATE_WRITE);
	while (done < len)
	{
		ssize_t		n = pread(wb_fd, wb_copy + off + done, len - done, (off_t) (off + done));

		if (n <= 0)
		{
			/* cannot happen for a file we have mapped; copy from the mapping */
			memcpy(wb_copy + off + done, wb_file_map + off + done, len - done);
			return;
		}
		done += (size_t) n;
	}
}

/*
 * Load the copy from the file: everything up to the slot area, then the
 * slots the Leaf Table places on PMEM.  Then decide whether the file can
 * be trusted, and from now on write through until the worker arms.
 */
static void
wb_load(void)
{
	AmrPoolHeader *hdr = (AmrPoolHeader *) (wb_copy + wb_header_off);
	const AmrLeafTableEntry *lt;
	uint8	   *used;
	uint64		id,
				s,
				nslots;
	size_t		loaded;
	TimestampTz load_start = GetCurrentTimestamp();

	wb_load_range(0, ((const AmrPoolHeader *) (wb_file_map + wb_header_off))->slots_offset);
	nslots = hdr->pmem_nslots;
	lt = (const AmrLeafTableEntry *) (wb_copy + hdr->lt_offset);
	used = palloc0(nslots + 1);
	loaded = hdr->slots_offset;
	for (id = 0; id < hdr->lt_capacity; id++)
	{
		uint64		word = lt[id].word;

		if (AMR_WORD_TIER(word) == AMR_TIER_PMEM && AMR_WORD_SLOT(word) < nslots)
			used[AMR_WORD_SLOT(word)] = 1;
	}
	for (s = 0; s < nslots;)
	{
		uint64		e;
		size_t		off;

		if (!used[s])
		{
			s++;
			continue;
		}
		for (e = s; e < nslots && used[e]; e++)
			;
		off = hdr->slots_offset + (size_t) s * AMR_SLOT_SIZE;
		wb_load_range(off, (size_t) (e - s) * AMR_SLOT_SIZE);
		loaded += (size_t) (e - s) * AMR_SLOT_SIZE;
		s = e;
	}
	pfree(used);
	ereport(LOG,
			(errmsg("amrtree: loaded %zu MB of pool \"%s\" into shared memory in %.2f s",
					loaded >> 20, amr_pool_path_display(),
					(double) (GetCurrentTimestamp() - load_start) / USECS_PER_SEC)));

	if (hdr->writeback != 0)
	{
		XLogRecPtr	start = wb_recovery_start();
		bool		same_boot;

		/*
		 * Replay that was not stopped cleanly (AMR_WB_RECOVERY) left pages it
		 * wrote unsynced; on the same boot the page cache still has them.  A
		 * clean stop synced the file and recorded how far it is complete
		 * (AMR_WB_STOPPED: wb_recovery_at_exit), so that position decides, as
		 * after a reboot: an older copy of the file put back while the server
		 * was stopped would otherwise be taken for the file replay wrote, and
		 * miss every change between the two.
		 */
		same_boot = hdr->writeback == AMR_WB_RECOVERY &&
			hdr->boot != 0 && hdr->boot == wb_boot_tag();

		/*
		 * A test's stand-in for an operating-system crash during replay: the
		 * machine restarted, and the header's extent writes since recovery
		 * started were lost while the pages written after them were kept.
		 */
		if (same_boot && AMR_FAULT_ACTIVE("writeback:reboot_lost_extent"))
		{
			same_boot = false;
			hdr->wal_extent = Min(hdr->wal_extent, start);
		}
		if (hdr->fenced_redo < start && !same_boot)
		{
			ereport(LOG,
					(errmsg("amrtree: pool \"%s\" is not complete up to the WAL position recovery starts from; its indexes are rebuilt",
							amr_pool_path_display()),
					 errdetail("The file holds every change before %X/%X; recovery starts at %X/%X.",
							   LSN_FORMAT_ARGS(hdr->fenced_redo), LSN_FORMAT_ARGS(start))));
			hdr->history_reset = 1;
		}
		else if (hdr->writeback == AMR_WB_RECOVERY && !same_boot)
			amr_lineage_after_unsynced_replay(hdr, hdr->fenced_redo);
		hdr->writeback = AMR_WB_COMPLETE;
		wb_write_header();
	}
}

bool
amr_wb_start(const char *path, char *file_map, size_t file_size, AmrPoolHeader *file_hdr)
{
	int			fd;
	char	   *copy;

	fd = open(path, O_RDWR | PG_BINARY, 0);
	if (fd < 0)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("amrtree: could not open \"%s\" for write-back, persisting with msync instead: %m",
						path)));
		return false;
	}
	/* pages are allocated as the pool fills: reserve nothing up front */
	copy = mmap(NULL, file_size, PROT_READ | PROT_WRITE,
				MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (copy == MAP_FAILED)
	{
		ereport(LOG,
				(errmsg("amrtree: could not map %zu MB of shared memory for the write-back copy of \"%s\", persisting with msync instead: %m",
						file_size >> 20, path)));
		close(fd);
		return false;
	}
	wb_fd = fd;
	wb_copy = copy;
	wb_file_map = file_map;
	wb_size = file_size;
	wb_header_off = (size_t) ((char *) file_hdr - file_map);
	wb_dirty_from = (size_t) file_hdr->lt_offset;
	wb_lt_off = (size_t) file_hdr->lt_offset;
	wb_lt_end = wb_lt_off + (size_t) file_hdr->lt_capacity * sizeof(AmrLeafTableEntry);
	wb_active = true;
	amr_persist_hook = wb_flush_hook;
	amr_persist_batch_hook = wb_batch_hook;
	wb_load();
	return true;
}

char *
amr_wb_copy_base(void)
{
	return wb_copy;
}

bool
amr_wb_active(void)
{
	return wb_active;
}

void
amr_wb_reload(void)
{
	if (wb_active)
		wb_load();
}

void
amr_wb_before_device_write(void)
{
	if (wb_active && wb_shared != NULL && pg_atomic_read_u32(&wb_shared->armed) != 0)
		wb_flush_wal();
}

void
amr_wb_describe(StringInfo buf)
{
	if (!wb_active || wb_shared == NULL)
		return;
	appendStringInfo(buf, "; write-back %s, %llu pages written, %llu fences, complete before %X/%X",
					 pg_atomic_read_u32(&wb_shared->armed) == 0 ? "not running (writing through)" :
					 pg_atomic_read_u32(&wb_shared->partner_holding) == 0 ? "running without its partner" :
					 "running",
					 (unsigned long long) pg_atomic_read_u64(&wb_shared->pages_written),
					 (unsigned long long) pg_atomic_read_u64(&wb_shared->fences),
					 LSN_FORMAT_ARGS(pg_atomic_read_u64(&wb_shared->fenced_redo)));
}
