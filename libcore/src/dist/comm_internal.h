/* comm_internal: what comm.c (launch, groups) and comm_ops.c (the collectives) share - the
 * MPI handles behind moe_comm.impl and the one way an operation is waited for (with the
 * deadline of moe_comm.timeout_s). Only built with MPI. */
#ifndef MOE_COMM_INTERNAL_H
#define MOE_COMM_INTERNAL_H

#ifdef MOE_HAVE_MPI
#include <mpi.h>

#include "moe/comm.h"

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
