/*-------------------------------------------------------------------------
 *
 * amr_ssd.h
 *		The SSD tier: a slot file of 4 KiB leaf images read and written with
 *		O_DIRECT through io_uring (or plain pread/pwrite).
 *
 * Block 0 of the file is a header; slot s lives at offset (s + 1) * 4 KiB.
 * Images written to the SSD tier are immutable while a Leaf Table word
 * references them: every change writes a new slot.  That is what lets
 * readers read without holding the leaf lock and validate afterwards.
 *
 *-------------------------------------------------------------------------
 */
#ifndef AMR_SSD_H
#define AMR_SSD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AMR_SSD_MAGIC			UINT64_C(0x3130445353524d41)	/* "AMRSSD01" */
#define AMR_SSD_FORMAT_VERSION	1

typedef struct AmrSsdHeader
{
	uint64_t	magic;
	uint32_t	format_version;
	uint32_t	slot_size;
	uint64_t	system_identifier;
	uint64_t	pool_id;		/* the pool whose Leaf Table indexes it */
	uint64_t	file_id;		/* random; recorded in the pool header */
	uint64_t	nslots;
	uint64_t	created_at;
	uint32_t	checksum;		/* CRC-32C of the header with this field 0 */
	uint32_t	reserved;
} AmrSsdHeader;

typedef enum AmrIoMethod
{
	AMR_IO_URING,
	AMR_IO_SYNC
} AmrIoMethod;

typedef enum AmrSsdSync
{
	AMR_SSD_SYNC_FDATASYNC,		/* fdatasync after each write */
	AMR_SSD_SYNC_DSYNC,			/* file opened O_DSYNC */
	AMR_SSD_SYNC_NONE			/* no sync: measurement only, not crash safe */
} AmrSsdSync;

/* Per-process I/O state; the file descriptor is inherited from the postmaster. */
typedef struct AmrSsdIo
{
	int			fd;				/* O_DIRECT */
	AmrIoMethod method;
	AmrSsdSync	sync;
	bool		ring_ready;
	void	   *ring;			/* struct io_uring, allocated on first use */
	int			depth;
	int			ring_error;		/* -errno: no ring in this process, so
								 * pread/pwrite; 0: none seen */
} AmrSsdIo;

static inline uint64_t
amr_ssd_offset(uint32_t slot)
{
	return ((uint64_t) slot + 1) * 4096;
}

/* Header helpers (block 0). */
extern uint32_t amr_ssd_header_checksum(const AmrSsdHeader *h);

/*
 * Read n slots into n 4 KiB-aligned buffers.  With io_uring all n reads are
 * submitted before waiting for any (queue depth n).  Returns 0, or -errno;
 * a short read returns -EIO.  On an error *failed is the index in slots[]
 * of the slot whose transfer failed, or -1 if the failure was not one
 * slot's (the ring's).  If this process cannot set up a ring, this and the
 * writes below use pread/pwrite (io->ring_error says why).
 */
extern int	amr_ssd_read_slots(AmrSsdIo *io, const uint32_t *slots, void *const *bufs,
							   int n, int *failed);

/*
 * Write n slots from n 4 KiB-aligned buffers, all submitted before waiting
 * for any (as amr_ssd_read_slots), without syncing: call amr_ssd_sync()
 * before anything may depend on them.  Returns 0 or -errno, and *failed
 * as amr_ssd_read_slots.
 */
extern int	amr_ssd_write_slots(AmrSsdIo *io, const uint32_t *slots, void *const *bufs,
								int n, int *failed);

/*
 * Write one slot from a 4 KiB-aligned buffer; with "sync", make it durable
 * according to io->sync (with io_uring, a linked fdatasync).  Returns 0 or
 * -errno.
 */
extern int	amr_ssd_write_slot(AmrSsdIo *io, uint32_t slot, const void *buf,
							   bool sync);

/* Make earlier unsynced writes durable (fdatasync policy). */
extern int	amr_ssd_sync(AmrSsdIo *io);

/* Tear down the ring (process exit). */
extern void amr_ssd_io_close(AmrSsdIo *io);

/*
 * Can this process set up an io_uring ring?  Returns 0, or the -errno of
 * the failure (a seccomp profile, kernel.io_uring_disabled, a kernel
 * without it).  The ring is torn down again.
 */
extern int	amr_ssd_uring_probe(void);

#endif							/* AMR_SSD_H */
