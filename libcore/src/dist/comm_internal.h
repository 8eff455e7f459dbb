/* comm_internal: what the files of dist/ share - the MPI handles behind moe_comm.impl and
 * the one way an operation is waited for (with the deadline of moe_comm.timeout_s), both only
 * with MPI; the TCP rendezvous of a torchrun-style launch (comm_tcp.c), in every build; the
 * groups' names; and the NCCL side (comm_dev.c): which buffers go through it, and its
 * collectives. */
#ifndef MOE_COMM_INTERNAL_H
#define MOE_COMM_INTERNAL_H

#include <stddef.h>

#include "moe/comm.h"

/* The rendezvous of a torchrun-style launch: rank 0 listens on port (MASTER_PORT) of every
 * interface of the family addr (MASTER_ADDR; IPv4 or IPv6) resolves to, takes one connection from
 * each of the world - 1 other ranks, checks what each announces (its rank, WORLD_SIZE, blob_len:
 * MOE_ERR_INPUT naming both sides' values, and the other rank hears why) and sends each its blob
 * [blob_len] (the NCCL unique id); ranks > 0 connect with retries (rank 0 may start later) and
 * receive blob. Every wait ends within timeout_s (0 = none): a missing rank is MOE_ERR_RUNTIME on
 * rank 0 naming how many arrived and which are missing. A port in use or an address that does not
 * resolve is MOE_ERR_INPUT with a hint. world 1 returns at once; no global state. */
moe_status moe_comm_tcp_exchange(const char *addr, int port, int rank, int world, void *blob,
                                 size_t blob_len, double timeout_s, moe_err *err);

/* "world", "expert (ep)", "data-parallel (dp)": group g in messages. */
const char *moe_comm_group_name(moe_comm_group g);

#ifdef MOE_HAVE_NCCL
#include "moe/comm_nccl.h"

/* The NCCL communicator of group g that a collective with buffer p (NULL: a barrier) goes
 * through, or NULL (MPI, or no transport): NCCL is attached and p is device memory or no MPI
 * was started (a torchrun-style launch, whose host buffers are staged through NCCL). NULL in
 * every run NCCL is not attached to. p must point into its allocation: every rank must
 * decide alike. */
moe_nccl *moe_comm_dev_route(const moe_comm *c, moe_comm_group g, const void *p);
#endif

#ifdef MOE_HAVE_MPI
#include <mpi.h>

struct moe_comm_impl {
    MPI_Comm group[MOE_COMM_N_GROUPS]; /* world (a dup of MPI_COMM_WORLD), ep, dp */
};

/* Waits for reqs [n] to complete. An MPI error is MOE_ERR_RUNTIME naming `what` and group
 * g; missing the deadline prints the same and ends the job on every rank (MPI_Abort). */
moe_status moe_comm_wait(const moe_comm *c, moe_comm_group g, MPI_Request *reqs, int n,
                         const char *what, moe_err *err);
/* MOE_ERR_RUNTIME for MPI error code rc of `what` on group g. */
moe_status moe_comm_mpi_fail(const moe_comm *c, moe_comm_group g, int rc, const char *what,
                             moe_err *err);
#endif

#endif
