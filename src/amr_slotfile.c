/*-------------------------------------------------------------------------
 *
 * amr_slotfile.c
 *		The SSD slot file: validating, creating, enlarging and locking it,
 *		at postmaster start, for the pool that refers to it.
 *
 * Block 0 is a header (magic, format, system identifier, pool id, file id,
 * slot count, CRC); slot s is at (s + 1) * 4 KiB.  The pool header records
 * the file id, so a missing, foreign or truncated file is refused; one
 * server per file (flock).  The descriptor every process reads and writes
 * leaves through (O_DIRECT) is opened here and inherited.
 *
 *-------------------------------------------------------------------------
 */
#include "amrtree.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libpmem.h>

#include "access/xlog.h"
#include "miscadmin.h"
#include "utils/guc.h"

static bool slotfile_lost = false;
static int	ssd_lock_fd = -1;	/* flock()ed for the postmaster's lifetime */

/* the slot file (opened by the postmaster, inherited by every child) */
AmrSsdIo	amr_ssd_io = {-1, AMR_IO_URING, AMR_SSD_SYNC_FDATASYNC, false, NULL, 0, 0};
static uint32 ssd_nslots = 0;
static char ssd_media[128];

/*
 * Returns false if block 0 is not an amrtree slot file header, with errno
 * set if it could not be read (0 if the file is too short to hold one).
 */
static bool
read_ssd_header(int fd, AmrSsdHeader *h)
{
	char		buf[AMR_SLOT_SIZE];

	memset(h, 0, sizeof(*h));
	errno = 0;
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
	errno = 0;
	if (pwrite(fd, buf, sizeof(buf), 0) != sizeof(buf))
	{
		/* a short write without an error: out of space, presumably */
		if (errno == 0)
			errno = ENOSPC;
		return false;
	}
	return fsync(fd) == 0;
}

/* Slots of an existing slot file, so that the Leaf Table can cover them. */
uint64
amr_slotfile_peek_slots(const char *path)
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
 * Did the last amr_slotfile_open fail because the file's leaves are lost to
 * this pool (missing, wiped, truncated, or a stale file of this cluster) --
 * as opposed to an error that another server, a setting, the file's
 * permissions or the device causes, where the file must be left alone?
 */
bool
amr_slotfile_was_lost(void)
{
	return slotfile_lost;
}

/* Let go of the lock on a slot file that is being replaced. */
void
amr_slotfile_forget_lock(void)
{
	if (ssd_lock_fd >= 0)
		close(ssd_lock_fd);
	ssd_lock_fd = -1;
}

/*
 * With amrtree.io_method = io_uring, check in the postmaster that a ring can
 * be set up; every process it starts inherits the reason it cannot (a
 * container's seccomp profile, kernel.io_uring_disabled, an old kernel).
 * If not, say so once and set amrtree.io_method to sync, so that SHOW tells
 * the truth and no process tries and fails again.  Each process would fall
 * back by itself anyway (amr_ssd.c): this is about saying it.
 */
static void
check_io_uring(void)
{
	int			rc;

	if ((AmrIoMethod) amr_io_method_setting != AMR_IO_URING)
		return;
	rc = amr_ssd_uring_probe();
	if (rc == 0)
		return;
	ereport(LOG,
			(errmsg("amrtree: io_uring is not available, so the SSD tier is read and written with pread and pwrite"),
			 errdetail("Setting up an io_uring ring failed: %s.", strerror(-rc)),
			 errhint("Set amrtree.io_method = sync to skip the attempt, or allow io_uring "
					 "(kernel.io_uring_disabled, the container's seccomp profile).")));
	SetConfigOption("amrtree.io_method", "sync", PGC_POSTMASTER, PGC_S_OVERRIDE);
}

/*
 * Open, validate, create or enlarge the slot file, for the pool "hdr".  On
 * failure the whole of amrtree is unusable (the pool's Leaf Table may point
 * into the file), with the reason stored for every later use.
 */
bool
amr_slotfile_open(const char *path, uint64 want_slots, AmrPoolHeader *hdr)
{
	char		detail[1024];
	AmrSsdHeader h;
	struct stat st;
	int			fd;
	int			rc;
	bool		header_ok;
	int			flags = O_RDWR | PG_BINARY;

	slotfile_lost = false;
	if (stat(path, &st) != 0)
	{
		if (errno != ENOENT)
		{
			snprintf(detail, sizeof(detail), "stat(\"%s\") failed: %s", path, strerror(errno));
			amr_pool_fail("could not access the SSD slot file", detail, NULL);
			return false;
		}
		if (hdr->ssd_file_id != 0)
		{
			snprintf(detail, sizeof(detail),
					 "The PMEM pool's Leaf Table refers to leaves in slot file %016llx, which is gone.",
					 (unsigned long long) hdr->ssd_file_id);
			slotfile_lost = true;
			amr_pool_fail("the SSD slot file is missing", detail,
						  "Restore the file at amrtree.ssd_path, or move the PMEM pool away too and "
						  "restart; then REINDEX every amrtree index.");
			return false;
		}
		if (want_slots == 0)
			return true;		/* no SSD tier */
		if (!amr_prepare_parent_directory(path, "amrtree.ssd_path"))
			return false;
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | PG_BINARY, S_IRUSR | S_IWUSR);
		/* posix_fallocate returns its error rather than setting errno */
		rc = fd < 0 ? errno :
			posix_fallocate(fd, 0, (off_t) ((want_slots + 1) * AMR_SLOT_SIZE));
		if (rc != 0)
		{
			snprintf(detail, sizeof(detail), "creating \"%s\" (%llu MB) failed: %s", path,
					 (unsigned long long) ((want_slots * AMR_SLOT_SIZE) >> 20), strerror(rc));
			if (fd >= 0)
			{
				close(fd);
				unlink(path);
			}
			amr_pool_fail("could not create the SSD slot file", detail,
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
		h.file_id = amr_random_id();
		h.nslots = want_slots;
		h.created_at = (uint64) time(NULL);
		h.checksum = amr_ssd_header_checksum(&h);
		if (!write_ssd_header(fd, &h))
		{
			snprintf(detail, sizeof(detail), "writing the header of \"%s\" failed: %s", path, strerror(errno));
			close(fd);
			unlink(path);
			amr_pool_fail("could not create the SSD slot file", detail, NULL);
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
		int			lock_errno = 0;

		ssd_lock_fd = open(path, O_RDONLY | PG_BINARY, 0);
		if (ssd_lock_fd >= 0 && (lock_errno = amr_lock_file_waiting(ssd_lock_fd, path)) != 0)
		{
			snprintf(detail, sizeof(detail), "flock(\"%s\") failed: %s", path, strerror(lock_errno));
			close(ssd_lock_fd);
			ssd_lock_fd = -1;
			amr_pool_fail("the SSD slot file is in use by another server", detail,
						  "Give every server its own amrtree.ssd_path (and amrtree.pmem_path).");
			return false;
		}
	}

	/*
	 * A file that cannot be opened or read says nothing about its contents:
	 * it may well hold this pool's leaves, and a permission, a read-only
	 * mount or a device error is for the operator to fix.  So refuse the pool
	 * and leave the file alone; only a file that is read and turns out not to
	 * be a slot file (or this pool's) is lost.
	 */
	fd = open(path, O_RDWR | PG_BINARY, 0);
	if (fd < 0)
	{
		int			open_errno = errno;

		snprintf(detail, sizeof(detail), "open(\"%s\") for reading and writing failed: %s",
				 path, strerror(open_errno));
		amr_pool_fail("could not open the SSD slot file", detail,
					  open_errno == EACCES || open_errno == EPERM ?
					  "Give the server's operating system user read and write access to the file "
					  "at amrtree.ssd_path, then restart the server.  The file was left as it is." :
					  open_errno == EROFS ?
					  "Mount the file system of amrtree.ssd_path read-write, then restart the "
					  "server.  The file was left as it is." :
					  "Correct the cause, then restart the server.  The file was left as it is.");
		return false;
	}
	header_ok = read_ssd_header(fd, &h);
	if (!header_ok && errno != 0)
	{
		snprintf(detail, sizeof(detail), "reading the header of \"%s\" failed: %s",
				 path, strerror(errno));
		close(fd);
		amr_pool_fail("could not read the SSD slot file", detail,
					  "Check the device, then restart the server.  The file was left as it is.");
		return false;
	}
	if (!header_ok || h.checksum != amr_ssd_header_checksum(&h))
	{
		snprintf(detail, sizeof(detail), "\"%s\" has no valid amrtree slot file header.", path);
		close(fd);
		slotfile_lost = true;
		amr_pool_fail("the SSD slot file is not an amrtree slot file", detail,
					  "Point amrtree.ssd_path at this cluster's slot file.");
		return false;
	}
	if (h.format_version != AMR_SSD_FORMAT_VERSION || h.slot_size != AMR_SLOT_SIZE)
	{
		snprintf(detail, sizeof(detail), "The slot file has format version %u, this build uses %u.",
				 h.format_version, AMR_SSD_FORMAT_VERSION);
		close(fd);
		amr_pool_fail("the SSD slot file has an incompatible format", detail,
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
		h.file_id = amr_random_id();
		h.checksum = amr_ssd_header_checksum(&h);
		if (!write_ssd_header(fd, &h))
		{
			snprintf(detail, sizeof(detail), "rewriting the header of \"%s\" failed: %s",
					 path, strerror(errno));
			close(fd);
			amr_pool_fail("could not reuse the SSD slot file", detail, NULL);
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
		/* a stale file of this cluster may go; another cluster's never */
		slotfile_lost = h.system_identifier == GetSystemIdentifier();
		amr_pool_fail("the SSD slot file belongs to another cluster or pool", detail,
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
		slotfile_lost = true;
		amr_pool_fail("the SSD slot file is truncated", detail,
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
		rc = posix_fallocate(fd, 0, (off_t) ((want_slots + 1) * AMR_SLOT_SIZE));
		if (rc == 0)
		{
			h.nslots = want_slots;
			h.checksum = amr_ssd_header_checksum(&h);
			if (write_ssd_header(fd, &h))
				ereport(LOG, (errmsg("amrtree: enlarged SSD slot file \"%s\" to %llu slots",
									 path, (unsigned long long) want_slots)));
			else
				rc = errno;
		}
		if (rc != 0)
		{
			/* posix_fallocate returns its error rather than setting errno */
			errno = rc;
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("amrtree: could not enlarge SSD slot file \"%s\": %m", path)));
		}
	}
	close(fd);

	/* the descriptor every process reads and writes leaves through */
	if ((AmrSsdSync) amr_ssd_sync_setting == AMR_SSD_SYNC_DSYNC)
		flags |= O_DSYNC;
	fd = open(path, flags | O_DIRECT, 0);
	if (fd < 0)
	{
		snprintf(detail, sizeof(detail), "open(\"%s\", O_DIRECT) failed: %s", path, strerror(errno));
		amr_pool_fail("could not open the SSD slot file for direct I/O", detail,
					  "Put amrtree.ssd_path on a file system that supports O_DIRECT (not tmpfs).");
		return false;
	}
	amr_ssd_io.fd = fd;
	amr_ssd_io.sync = (AmrSsdSync) amr_ssd_sync_setting;
	check_io_uring();
	ssd_nslots = (uint32) Min(h.nslots, (uint64) AMR_MAX_SLOTS);
	snprintf(ssd_media, sizeof(ssd_media), "%s (%u slots, O_DIRECT, sync %s)", path, ssd_nslots,
			 amr_ssd_io.sync == AMR_SSD_SYNC_FDATASYNC ? "fdatasync" :
			 amr_ssd_io.sync == AMR_SSD_SYNC_DSYNC ? "O_DSYNC" : "none (not crash safe)");
	return true;
}

/* Slots of the SSD tier (0: none). */
uint32
amr_slotfile_nslots(void)
{
	return ssd_nslots;
}

/* Never use more SSD slots than the Leaf Table can name. */
void
amr_slotfile_limit_slots(uint64 max_slots)
{
	ssd_nslots = (uint32) Min((uint64) ssd_nslots, max_slots);
}

/* The slot file, its size and sync mode, for logs and amrtree_pool_stats. */
const char *
amr_slotfile_describe(void)
{
	return ssd_media;
}
