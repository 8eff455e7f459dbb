/* test_npy: the .npy writer (streamed rows, header patched at commit) and strict reader.
 *
 * Checks the exact header bytes numpy expects (magic, version 1.0, length, dict, 64-byte
 * aligned data, '\n'), f32 bit-exact round trips, f16 rounding, a 1-D array, headers as
 * numpy.save writes them (shorter, other key order), and refusal of malformed files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/dtype.h"
#include "moe/npy.h"
#include "testlib.h"

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    fwrite(data, 1, n, fp);
    fclose(fp);
}

static void test_f32_roundtrip(const char *path) {
    moe_err err;
    moe_err_clear(&err);
    moe_npy_writer w;
    CHECK_INT_EQ(moe_npy_writer_open(&w, path, MOE_NPY_F32, 3, &err), MOE_OK);
    float rows[12];
    for (int i = 0; i < 12; i++)
        rows[i] = (float)i * 0.1f - 0.55f;
    CHECK_INT_EQ(moe_npy_writer_append(&w, rows, 1, &err), MOE_OK);
    CHECK_INT_EQ(moe_npy_writer_append(&w, rows + 3, 3, &err), MOE_OK);
    CHECK(access(path, F_OK) != 0); /* not under its final name before commit */
    CHECK_INT_EQ(moe_npy_writer_commit(&w, &err), MOE_OK);

    char *buf;
    size_t len;
    CHECK_INT_EQ(moe_read_file(path, &buf, &len, &err), MOE_OK);
    CHECK_INT_EQ(len, MOE_NPY_HEADER_BYTES + 12 * 4);
    CHECK(memcmp(buf, "\x93NUMPY\x01\x00", 8) == 0);
    CHECK_INT_EQ((unsigned char)buf[8] | (unsigned char)buf[9] << 8, MOE_NPY_HEADER_BYTES - 10);
    CHECK_INT_EQ(MOE_NPY_HEADER_BYTES % 64, 0);
    CHECK(buf[MOE_NPY_HEADER_BYTES - 1] == '\n');
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }";
    CHECK(memcmp(buf + 10, dict, strlen(dict)) == 0);
    CHECK(memcmp(buf + MOE_NPY_HEADER_BYTES, rows, sizeof rows) == 0);
    free(buf);

    float *data;
    int ndim;
    int64_t shape[2];
    moe_npy_dtype dt;
    CHECK_INT_EQ(moe_npy_read_f32(path, &data, &ndim, shape, &dt, &err), MOE_OK);
    CHECK_INT_EQ(ndim, 2);
    CHECK_INT_EQ(shape[0], 4);
    CHECK_INT_EQ(shape[1], 3);
    CHECK_INT_EQ(dt, MOE_NPY_F32);
    CHECK(data && memcmp(data, rows, sizeof rows) == 0);
    free(data);
}

static void test_f16_and_1d(const char *path) {
    moe_err err;
    moe_err_clear(&err);
    moe_npy_writer w;
    CHECK_INT_EQ(moe_npy_writer_open(&w, path, MOE_NPY_F16, 0, &err), MOE_OK);
    float v[5] = {1.0f, -2.5f, 65504.0f, 1e-8f, 0.1f};
    CHECK_INT_EQ(moe_npy_writer_append(&w, v, 5, &err), MOE_OK);
    CHECK_INT_EQ(moe_npy_writer_commit(&w, &err), MOE_OK);
    float *data;
    int ndim;
    int64_t shape[2];
    moe_npy_dtype dt;
    CHECK_INT_EQ(moe_npy_read_f32(path, &data, &ndim, shape, &dt, &err), MOE_OK);
    CHECK_INT_EQ(ndim, 1);
    CHECK_INT_EQ(shape[0], 5);
    CHECK_INT_EQ(dt, MOE_NPY_F16);
    for (int i = 0; data && i < 5; i++)
        CHECK_MSG(data[i] == moe_f16_to_f32(moe_f32_to_f16(v[i])), "f16 element %d: %g", i,
                  (double)data[i]);
    CHECK(data && data[4] != 0.1f && data[3] == 0.0f);
    free(data);
}

/* A 64-byte header with the keys in another order and a 1-tuple shape, as other writers
 * produce; then damaged variants of it. */
static void test_numpy_style(const char *path) {
    char img[64 + 8];
    memset(img, 0, sizeof img);
    memcpy(img, "\x93NUMPY\x01\x00\x36\x00", 10);
    const char *d = "{'shape':(2,),'fortran_order':False,'descr':'<f4'}";
    memset(img + 10, ' ', 54);
    memcpy(img + 10, d, strlen(d));
    img[63] = '\n';
    float two[2] = {3.0f, -4.0f};
    memcpy(img + 64, two, 8);
    write_bytes(path, img, sizeof img);
    moe_err err;
    moe_err_clear(&err);
    float *data;
    int ndim;
    int64_t shape[2];
    moe_npy_dtype dt;
    CHECK_INT_EQ(moe_npy_read_f32(path, &data, &ndim, shape, &dt, &err), MOE_OK);
    CHECK_MSG(data && data[0] == 3.0f && data[1] == -4.0f && shape[0] == 2 && ndim == 1, "%s",
              err.msg);
    free(data);

    /* Fortran order, big-endian, truncated data: each refused with a message */
    const char *bad[3] = {"{'shape':(2,),'fortran_order':True,'descr':'<f4'}",
                          "{'shape':(2,),'fortran_order':False,'descr':'>f4'}",
                          "{'shape':(3,),'fortran_order':False,'descr':'<f4'}"};
    for (int i = 0; i < 3; i++) {
        memset(img + 10, ' ', 53);
        memcpy(img + 10, bad[i], strlen(bad[i]));
        write_bytes(path, img, sizeof img);
        moe_err_clear(&err);
        data = NULL;
        CHECK_INT_EQ(moe_npy_read_f32(path, &data, &ndim, shape, &dt, &err), MOE_ERR_INPUT);
        CHECK(data == NULL && strstr(err.msg, "not a supported .npy") != NULL);
    }
}

int main(void) {
    char path[64];
    snprintf(path, sizeof path, "test_npy_%d.npy", (int)getpid());
    test_f32_roundtrip(path);
    test_f16_and_1d(path);
    test_numpy_style(path);
    moe_err err;
    moe_err_clear(&err);
    moe_npy_writer w;
    CHECK_INT_EQ(moe_npy_writer_open(&w, "-", MOE_NPY_F32, 2, &err), MOE_ERR_INPUT);
    unlink(path);
    return test_summary("npy");
}
