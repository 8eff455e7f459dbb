/* test_comm_launch: what moe_comm_init makes of a torchrun-style environment (RANK,
 * WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT without MPI): a full set of 4 ranks gives
 * rank, world, local rank and the rendezvous address, its collectives over several ranks fail
 * (no transport) and a CPU run refuses it with the mpirun/srun hint (moe_comm_check_host);
 * world 1 is one process; no variables is world 1 without torchrun; and the environments
 * that contradict themselves are input errors that name the variable: half a set, RANK or
 * LOCAL_RANK beyond WORLD_SIZE, MASTER_PORT not a port, several ranks without LOCAL_RANK or
 * MASTER_ADDR/MASTER_PORT; and two forked torchrun-style ranks share rank 0's blob
 * (moe_comm_share_blob over the TCP rendezvous); attaching a backend (moe_comm_attach_backend)
 * gives CPU ranks no NCCL, and a build without NCCL refuses GPU ranks. Run without a launcher
 * (ctest sets none). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "moe/comm.h"
#include "moe/ops.h"
#include "testlib.h"

static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                   "MASTER_PORT"};

/* Sets the five variables to vals [5] (NULL: unset) and runs moe_comm_init into *c. */
static moe_status init_with(const char *const *vals, moe_comm *c, moe_err *err) {
    for (int i = 0; i < 5; i++)
        if (vals[i])
            setenv(vars[i], vals[i], 1);
        else
            unsetenv(vars[i]);
    moe_err_clear(err);
    int argc = 1;
    char *args[] = {"test", NULL}, **argv = args;
    return moe_comm_init(c, &argc, &argv, err);
}

static void test_full_set(void) {
    const char *v[] = {"2", "4", "1", "127.0.0.1", "29511"};
    moe_comm c;
    moe_err err;
    CHECK_MSG(init_with(v, &c, &err) == MOE_OK, "%s", err.msg);
    CHECK_INT_EQ(c.rank, 2);
    CHECK_INT_EQ(c.world, 4);
    CHECK_INT_EQ(c.local_rank, 1);
    CHECK_INT_EQ(c.torchrun, 1);
    CHECK(strcmp(c.master_addr, "127.0.0.1") == 0);
    CHECK_INT_EQ(c.master_port, 29511);
    CHECK_INT_EQ(c.gsize[MOE_COMM_WORLD], 4);
    CHECK_INT_EQ(c.grank[MOE_COMM_WORLD], 2);
    CHECK(moe_comm_split(&c, 2, 5, &err) == MOE_OK);
    CHECK_INT_EQ(c.gsize[MOE_COMM_EP], 2);
    /* no transport: a sum over several ranks fails instead of doing nothing */
    double x = 1;
    moe_err_clear(&err);
    CHECK(moe_comm_allreduce(&c, MOE_COMM_WORLD, &x, 1, MOE_COMM_F64, &err) == MOE_ERR_RUNTIME);
    CHECK_MSG(strstr(err.msg, "no transport connects them"), "%s", err.msg);
    moe_err_clear(&err);
    CHECK(moe_comm_barrier(&c, MOE_COMM_EP, &err) == MOE_ERR_RUNTIME);
    /* the CPU backend refuses it, with the command that starts the same ranks over MPI */
    moe_err_clear(&err);
    CHECK(moe_comm_check_host(&c, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "RANK=2 WORLD_SIZE=4"), "%s", err.msg);
    CHECK_MSG(strstr(err.hint, "mpirun -np 4") && strstr(err.hint, "srun --mpi=pmix -n 4"), "%s",
              err.hint);
    moe_comm_finalize(&c);
    CHECK_INT_EQ(c.world, 1);
}

static void test_one_process(void) {
    moe_comm c;
    moe_err err;
    const char *one[] = {"0", "1", NULL, "localhost", "29512"};
    CHECK_MSG(init_with(one, &c, &err) == MOE_OK, "%s", err.msg);
    CHECK(c.world == 1 && c.rank == 0 && c.local_rank == 0 && c.torchrun == 1);
    CHECK(moe_comm_check_host(&c, &err) == MOE_OK);
    double x = 3;
    CHECK(moe_comm_allreduce(&c, MOE_COMM_WORLD, &x, 1, MOE_COMM_F64, &err) == MOE_OK && x == 3);
    const char *one_bare[] = {"0", "1", NULL, NULL, NULL}; /* world 1 needs no rendezvous */
    CHECK_MSG(init_with(one_bare, &c, &err) == MOE_OK, "%s", err.msg);
    CHECK(c.torchrun == 1 && c.master_port == 0 && c.master_addr[0] == '\0');
    const char *none[] = {NULL, NULL, NULL, NULL, NULL};
    CHECK(init_with(none, &c, &err) == MOE_OK);
    CHECK(c.world == 1 && c.torchrun == 0);
    CHECK(moe_comm_check_host(&c, &err) == MOE_OK);
}

/* vals must be refused with MOE_ERR_INPUT and a message holding want. */
static void refused(const char *const *vals, const char *want) {
    moe_comm c;
    moe_err err;
    CHECK_MSG(init_with(vals, &c, &err) == MOE_ERR_INPUT, "accepted: want '%s'", want);
    CHECK_MSG(strstr(err.msg, want), "'%s' lacks '%s'", err.msg, want);
}

static void test_inconsistent(void) {
    refused((const char *[]){NULL, "2", "0", "h", "1"}, "inconsistent torchrun-style environment");
    refused((const char *[]){"2", "2", "0", "h", "1"}, "RANK=2 WORLD_SIZE=2 LOCAL_RANK=0");
    refused((const char *[]){"1", "2", "2", "h", "1"}, "RANK=1 WORLD_SIZE=2 LOCAL_RANK=2");
    refused((const char *[]){"0", "2", "0", "h", "70000"},
            "MASTER_PORT='70000' is not a TCP port (a whole number in 1..65535)");
    refused((const char *[]){"0", "2", "0", "h", "http"}, "MASTER_PORT='http' is not a TCP port");
    refused((const char *[]){"0", "2", "0", "h", "0"}, "MASTER_PORT='0'");
    refused((const char *[]){"x", "2", "0", "h", "1"}, "RANK='x' is not a rank");
    refused((const char *[]){"1", "2", NULL, NULL, "29500"},
            "launch of RANK=1 WORLD_SIZE=2 without LOCAL_RANK MASTER_ADDR");
    refused((const char *[]){"1", "2", "1", "", NULL}, "without MASTER_ADDR MASTER_PORT");
}

/* Two forked torchrun-style ranks on the loopback: moe_comm_share_blob gives rank 1 rank
 * 0's bytes over the TCP rendezvous (a port from the pid: 20000..39999). */
static void test_share_blob(void) {
    char port[16];
    snprintf(port, sizeof port, "%d", 20000 + (int)(getpid() % 20000));
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] != 0) continue;
        char rank[4];
        snprintf(rank, sizeof rank, "%d", r);
        const char *v[] = {rank, "2", rank, "127.0.0.1", port};
        moe_comm c;
        moe_err err;
        unsigned char blob[128];
        for (int i = 0; i < 128; i++)
            blob[i] = r == 0 ? (unsigned char)(3 * i + 1) : 0;
        int ok = init_with(v, &c, &err) == MOE_OK && moe_comm_split(&c, 1, 20, &err) == MOE_OK &&
                 moe_comm_share_blob(&c, blob, sizeof blob, &err) == MOE_OK;
        for (int i = 0; ok && i < 128; i++)
            ok = blob[i] == (unsigned char)(3 * i + 1);
        if (!ok) fprintf(stderr, "rank %d: %s\n", r, err.msg);
        _exit(ok ? 0 : 1);
    }
    for (int r = 0; r < 2; r++) {
        int status = 0;
        waitpid(pid[r], &status, 0);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d did not get the blob", r);
    }
}

/* moe_comm_attach_backend: a CPU backend attaches nothing, so a torchrun-style launch of CPU
 * ranks keeps failing its collectives (no transport); in a build without NCCL a GPU backend
 * (a table named "cuda": only the name is read before the refusal) is refused for several
 * ranks with the rebuild hint, and attaches nothing for one. */
static void test_attach(void) {
    moe_comm c;
    moe_err err;
    const char *four[] = {"1", "4", "1", "127.0.0.1", "29513"};
    CHECK_MSG(init_with(four, &c, &err) == MOE_OK, "%s", err.msg);
    CHECK(moe_comm_split(&c, 1, 5, &err) == MOE_OK);
    CHECK_MSG(moe_comm_attach_backend(&c, moe_backend_cpu(), &err) == MOE_OK, "%s", err.msg);
    CHECK(c.dev == NULL);
    double x = 1;
    CHECK(moe_comm_allreduce(&c, MOE_COMM_WORLD, &x, 1, MOE_COMM_F64, &err) == MOE_ERR_RUNTIME);
    moe_comm_detach_backend(&c, 0);
#ifndef MOE_HAVE_NCCL
    moe_backend gpu = {.name = "cuda"};
    moe_err_clear(&err);
    CHECK(moe_comm_attach_backend(&c, &gpu, &err) == MOE_ERR_INPUT);
    CHECK_MSG(strstr(err.msg, "4 ranks on the GPU backend, but this build has no NCCL") &&
                  strstr(err.hint, "NCCL=ON"),
              "%s (%s)", err.msg, err.hint);
    const char *one[] = {"0", "1", NULL, NULL, NULL};
    CHECK_MSG(init_with(one, &c, &err) == MOE_OK, "%s", err.msg);
    CHECK(moe_comm_attach_backend(&c, &gpu, &err) == MOE_OK && c.dev == NULL);
#endif
    moe_comm_finalize(&c);
}

int main(void) {
    test_attach();
    test_full_set();
    test_share_blob();
    test_one_process();
    test_inconsistent();
    for (int i = 0; i < 5; i++)
        unsetenv(vars[i]);
    return test_summary("comm_launch");
}
