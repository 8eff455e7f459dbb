/* comm: who this process is in the run (moe/comm.h) - the launcher's environment read and
 * checked against MPI's view (or, for a torchrun-style launch, against itself), the dp x ep
 * groups, the job's end, and the deadline wait every collective of comm_ops.c goes through. Without
 * MPI in the build, a single process works as before and an MPI launch is refused. */
#include "moe/comm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm_internal.h"
#include "moe/log.h"

/* ---- the launcher's environment ---- */

/* Integer value of environment variable name into *v: 1 when set and a whole number in
 * lo..hi, 0 when unset; set but not such a number is MOE_ERR_INPUT saying it is not `what`. */
static int env_int(const char *name, int lo, int hi, const char *what, int *v, moe_err *err,
                   moe_status *st) {
    const char *s = getenv(name);
    if (!s) return 0;
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno || x < lo || x > hi) {
        *st = moe_err_set(err, MOE_ERR_INPUT, NULL,
                          "environment variable %s='%s' is not %s (a whole number in %d..%d)", name,
                          s, what, lo, hi);
        moe_err_hint(err, "leave %s to the launcher (mpirun, srun or torchrun)", name);
        return 0;
    }
    *v = (int)x;
    return 1;
}

#define RANK_MAX (1 << 24)

typedef struct launch_env {
    int mpi;              /* an MPI launcher's variables are present */
    int rank, world;      /* what it announced; -1 unknown */
    const char *rank_var; /* where they came from */
    int t_rank, t_world;  /* torchrun-style RANK / WORLD_SIZE, -1 unset */
    int t_local, t_port;  /* LOCAL_RANK (-1 unset), MASTER_PORT (0 unset) */
    const char *t_addr;   /* MASTER_ADDR, NULL unset */
    int t_set;            /* how many of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT */
} launch_env;

/* Reads the launchers' variables into *e (MOE_ERR_INPUT for malformed numbers). */
static moe_status read_env(launch_env *e, moe_err *err) {
    static const char *const mpi_vars[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                              {"PMI_RANK", "PMI_SIZE"},
                                              {"PMIX_RANK", "SLURM_STEP_NUM_TASKS"}};
    moe_status st = MOE_OK;
    memset(e, 0, sizeof *e);
    e->rank = e->world = e->t_rank = e->t_world = e->t_local = -1;
    for (size_t i = 0; i < sizeof mpi_vars / sizeof mpi_vars[0] && !e->mpi; i++) {
        int r = -1, w = -1;
        int has_r = env_int(mpi_vars[i][0], 0, RANK_MAX, "a rank", &r, err, &st);
        int has_w = env_int(mpi_vars[i][1], 0, RANK_MAX, "a process count", &w, err, &st);
        if (st != MOE_OK) return st;
        if (!has_r && !(has_w && i < 2)) continue; /* a Slurm step alone is not MPI */
        e->mpi = 1, e->rank = r, e->world = has_w ? w : -1, e->rank_var = mpi_vars[i][0];
    }
    if (!e->mpi && getenv("MPI_LOCALNRANKS")) e->mpi = 1; /* MPICH hydra, rank unknown here */
    static const char *const torch[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                        "MASTER_PORT"};
    for (size_t i = 0; i < sizeof torch / sizeof torch[0]; i++)
        e->t_set += getenv(torch[i]) != NULL;
    env_int("RANK", 0, RANK_MAX, "a rank", &e->t_rank, err, &st);
    env_int("WORLD_SIZE", 0, RANK_MAX, "a process count", &e->t_world, err, &st);
    env_int("LOCAL_RANK", 0, RANK_MAX, "a rank", &e->t_local, err, &st);
    env_int("MASTER_PORT", 1, 65535, "a TCP port", &e->t_port, err, &st);
    e->t_addr = getenv("MASTER_ADDR");
    return st;
}

/* c's rank and world (every group but ep spanning the world until moe_comm_split). */
static void set_world(moe_comm *c, int rank, int world) {
    c->rank = rank, c->world = world, c->dp = world;
    for (int g = 0; g < MOE_COMM_N_GROUPS; g++) {
        c->grank[g] = g == MOE_COMM_EP ? 0 : rank;
        c->gsize[g] = g == MOE_COMM_EP ? 1 : world;
    }
}

/* A torchrun-style launch (RANK and WORLD_SIZE, no MPI) into c: rank, world, local rank and
 * where rank 0 listens. A half-set or self-contradicting one is MOE_ERR_INPUT; LOCAL_RANK or
 * MASTER_* alone are no launch. */
static moe_status torchrun_launch(const launch_env *e, moe_comm *c, moe_err *err) {
    if (e->t_set == 0) return MOE_OK;
    if ((e->t_world < 0) != (e->t_rank < 0) || e->t_world == 0 ||
        (e->t_world > 0 && (e->t_rank >= e->t_world || e->t_local >= e->t_world))) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "inconsistent torchrun-style environment: RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s",
                    getenv("RANK") ? getenv("RANK") : "(unset)",
                    getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "(unset)",
                    getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "(unset)");
        moe_err_hint(err, "RANK and LOCAL_RANK count from 0 below WORLD_SIZE; unset them, or "
                          "launch several ranks with mpirun or srun");
        return MOE_ERR_INPUT;
    }
    if (e->t_world < 0) return MOE_OK;
    int no_addr = !e->t_addr || !e->t_addr[0];
    if (e->t_world > 1 && (e->t_local < 0 || no_addr || e->t_port == 0)) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "torchrun-style launch of RANK=%d WORLD_SIZE=%d without%s%s%s", e->t_rank,
                    e->t_world, e->t_local < 0 ? " LOCAL_RANK" : "", no_addr ? " MASTER_ADDR" : "",
                    e->t_port == 0 ? " MASTER_PORT" : "");
        moe_err_hint(err, "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and "
                          "MASTER_PORT for every rank: set the missing ones, or launch with "
                          "mpirun or srun");
        return MOE_ERR_INPUT;
    }
    if (e->t_addr && strlen(e->t_addr) >= sizeof c->master_addr) {
        moe_err_set(err, MOE_ERR_INPUT, NULL, "MASTER_ADDR is %zu characters long (at most %zu)",
                    strlen(e->t_addr), sizeof c->master_addr - 1);
        moe_err_hint(err, "set MASTER_ADDR to rank 0's host name or IP address");
        return MOE_ERR_INPUT;
    }
    set_world(c, e->t_rank, e->t_world);
    c->local_rank = e->t_local >= 0 ? e->t_local : 0;
    c->torchrun = 1;
    snprintf(c->master_addr, sizeof c->master_addr, "%s", e->t_addr ? e->t_addr : "");
    c->master_port = e->t_port;
    return MOE_OK;
}

moe_status moe_comm_check_host(const moe_comm *c, moe_err *err) {
    if (!c->torchrun || c->world == 1) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "started with torchrun-style variables (RANK=%d WORLD_SIZE=%d): CPU ranks "
                "communicate over MPI, which such a launch does not start",
                c->rank, c->world);
    moe_err_hint(err,
                 "launch with mpirun -np %d moe-train ... (one node) or srun --mpi=pmix -n %d "
                 "moe-train ... (Slurm), and unset RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/"
                 "MASTER_PORT",
                 c->world, c->world);
    return MOE_ERR_INPUT;
}

/* ---- init, groups, end ---- */

void moe_comm_single(moe_comm *c) {
    memset(c, 0, sizeof *c);
    c->world = c->dp = c->ep = 1;
    c->timeout_s = 0; /* parallel.timeout_s arrives with moe_comm_split */
    c->chunk = INT_MAX / 2;
    for (int g = 0; g < MOE_COMM_N_GROUPS; g++)
        c->gsize[g] = 1;
}

moe_status moe_comm_init(moe_comm *c, int *argc, char ***argv, moe_err *err) {
    moe_comm_single(c);
    launch_env e;
    moe_status st = read_env(&e, err);
    if (st == MOE_OK && !e.mpi) st = torchrun_launch(&e, c, err);
    if (st != MOE_OK || !e.mpi) return st;
#ifdef MOE_HAVE_MPI
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "MPI_Init failed");
    c->impl = calloc(1, sizeof *c->impl);
    if (!c->impl) return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "out of memory");
    MPI_Comm_dup(MPI_COMM_WORLD, &c->impl->group[MOE_COMM_WORLD]);
    MPI_Comm w = c->impl->group[MOE_COMM_WORLD];
    MPI_Comm_set_errhandler(w, MPI_ERRORS_RETURN);
    int rank, world;
    MPI_Comm_rank(w, &rank);
    MPI_Comm_size(w, &world);
    set_world(c, rank, world);
    MPI_Comm node;
    MPI_Comm_split_type(w, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &c->local_rank);
    MPI_Comm_free(&node);
    for (int g = 0; g < MOE_COMM_N_GROUPS; g++)
        c->impl->group[g] = g == MOE_COMM_EP ? MPI_COMM_SELF : w;
    if ((e.rank >= 0 && e.rank != c->rank) || (e.world > 0 && e.world != c->world)) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "the launcher announced rank %d of %d (%s) but MPI says rank %d of %d", e.rank,
                    e.world, e.rank_var, c->rank, c->world);
        moe_err_hint(err, "the environment mixes two launchers' variables: start the run with "
                          "one mpirun or srun");
        return MOE_ERR_INPUT;
    }
    if (e.t_set &&
        ((e.t_rank >= 0 && e.t_rank != c->rank) || (e.t_world >= 0 && e.t_world != c->world))) {
        moe_err_set(err, MOE_ERR_INPUT, NULL,
                    "torchrun-style RANK=%d WORLD_SIZE=%d contradict MPI's rank %d of %d", e.t_rank,
                    e.t_world, c->rank, c->world);
        moe_err_hint(err, "unset RANK and WORLD_SIZE under mpirun or srun");
        return MOE_ERR_INPUT;
    }
    return MOE_OK;
#else
    (void)argc;
    (void)argv;
    if (e.world == 1) return MOE_OK;
    moe_err_set(err, MOE_ERR_INPUT, NULL,
                "started by an MPI launcher (%s), but this build has no MPI",
                e.rank_var ? e.rank_var : "MPI_LOCALNRANKS");
    moe_err_hint(err, "install libopenmpi-dev and rebuild (make), or run one process");
    return MOE_ERR_INPUT;
#endif
}

moe_status moe_comm_split(moe_comm *c, int ep, double timeout_s, moe_err *err) {
    if (ep < 1 || c->world % ep)
        return moe_err_set(err, MOE_ERR_INPUT, NULL,
                           "parallel.ep=%d does not divide the %d ranks of the run", ep, c->world);
    c->timeout_s = timeout_s;
    c->ep = ep;
    c->dp = c->world / ep;
    c->grank[MOE_COMM_EP] = c->rank % ep, c->gsize[MOE_COMM_EP] = ep;
    c->grank[MOE_COMM_DP] = c->rank / ep, c->gsize[MOE_COMM_DP] = c->dp;
#ifdef MOE_HAVE_MPI
    if (!c->impl) return MOE_OK;
    MPI_Comm w = c->impl->group[MOE_COMM_WORLD], *gr = c->impl->group;
    int rc = MPI_Comm_split(w, c->rank / ep, c->rank, &gr[MOE_COMM_EP]);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split(w, c->rank % ep, c->rank, &gr[MOE_COMM_DP]);
    if (rc != MPI_SUCCESS) return moe_comm_mpi_fail(c, MOE_COMM_WORLD, rc, "MPI_Comm_split", err);
    MPI_Comm_set_errhandler(gr[MOE_COMM_EP], MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(gr[MOE_COMM_DP], MPI_ERRORS_RETURN);
#endif
    return MOE_OK;
}

void moe_comm_finalize(moe_comm *c) {
#ifdef MOE_HAVE_MPI
    if (c->impl) {
        MPI_Comm *gr = c->impl->group, w = gr[MOE_COMM_WORLD];
        for (int g = MOE_COMM_N_GROUPS - 1; g >= 0; g--)
            if (gr[g] != MPI_COMM_SELF && (g == MOE_COMM_WORLD || gr[g] != w))
                MPI_Comm_free(&gr[g]);
        free(c->impl);
        c->impl = NULL;
        MPI_Finalize();
    }
#endif
    moe_comm_single(c);
}

void moe_comm_abort(const moe_comm *c, int code) {
#ifdef MOE_HAVE_MPI
    if (c->impl && c->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
#else
    (void)c;
    (void)code;
#endif
}

size_t moe_comm_dtype_size(moe_comm_dtype dt) {
    return dt == MOE_COMM_F32                          ? 4
           : dt == MOE_COMM_BYTE                       ? 1
           : dt == MOE_COMM_U16 || dt == MOE_COMM_BF16 ? 2
                                                       : 8;
}

/* ---- waiting with a deadline ---- */

const char *moe_comm_group_name(moe_comm_group g) {
    static const char *const names[MOE_COMM_N_GROUPS] = {"world", "expert (ep)",
                                                         "data-parallel (dp)"};
    return names[g];
}

#ifdef MOE_HAVE_MPI

moe_status moe_comm_mpi_fail(const moe_comm *c, moe_comm_group g, int rc, const char *what,
                             moe_err *err) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    moe_err_set(err, MOE_ERR_RUNTIME, NULL, "rank %d: %s over the %s group failed: %s", c->rank,
                what, moe_comm_group_name(g), msg);
    moe_err_hint(err, "another rank of the run probably died: see its messages");
    return MOE_ERR_RUNTIME;
}

moe_status moe_comm_wait(const moe_comm *c, moe_comm_group g, MPI_Request *reqs, int n,
                         const char *what, moe_err *err) {
    double t0 = moe_time_now();
    for (long polls = 0;; polls++) {
        int done = 0, rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return moe_comm_mpi_fail(c, g, rc, what, err);
        if (done) return MOE_OK;
        /* spin briefly (latency), then sleep between polls: ranks share cores */
        if (polls > 2000) nanosleep(&(struct timespec){0, 100000}, NULL);
        if (c->timeout_s > 0 && (polls & 63) == 0 && moe_time_now() - t0 > c->timeout_s) {
            fprintf(stderr,
                    "moe: rank %d of %d: error: %s over the %s group did not complete within "
                    "parallel.timeout_s=%g s: another rank died, hangs or is that far behind; "
                    "ending the job on every rank\n",
                    c->rank, c->world, what, moe_comm_group_name(g), c->timeout_s);
            MPI_Abort(MPI_COMM_WORLD, 1);
            return moe_err_set(err, MOE_ERR_RUNTIME, NULL, "%s timed out", what);
        }
    }
}
#endif
