/* test_tensor: allocation (alignment, zero fill, bad shapes), strides, views. */
#include <stdint.h>
#include <string.h>

#include "moe/tensor.h"
#include "testlib.h"

static void test_alloc(void) {
    moe_err err;
    moe_err_clear(&err);
    moe_tensor t;
    int64_t dims[3] = {2, 3, 5};
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_BF16, 3, dims, &err), MOE_OK);
    CHECK_INT_EQ(moe_tensor_numel(&t), 30);
    CHECK_INT_EQ(moe_tensor_nbytes(&t), 60);
    CHECK_INT_EQ(t.strides[0], 15);
    CHECK_INT_EQ(t.strides[1], 5);
    CHECK_INT_EQ(t.strides[2], 1);
    CHECK_INT_EQ(t.dims[3], 1);
    CHECK_INT_EQ((uintptr_t)t.data % MOE_ALIGN, 0);
    CHECK(t.owns && t.device == MOE_DEV_CPU && moe_tensor_is_contiguous(&t));
    int zero = 1;
    for (int i = 0; i < 30; i++)
        zero &= ((uint16_t *)t.data)[i] == 0;
    CHECK(zero);
    /* element addressing follows the strides */
    CHECK((char *)moe_tensor_at(&t, 1, 2, 3, 0) - (char *)t.data == 2 * (15 + 10 + 3));
    char buf[64];
    CHECK(strcmp(moe_tensor_describe(&t, buf, sizeof buf), "bf16[2, 3, 5] cpu") == 0);
    moe_tensor_describe(&t, buf, 6); /* truncation is safe */
    CHECK(strcmp(buf, "bf16[") == 0);
    moe_tensor_free(&t);
    CHECK(t.data == NULL && t.owns == 0);
    moe_tensor_free(&t); /* twice is harmless */

    /* scalar and empty tensors */
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_F32, 0, NULL, &err), MOE_OK);
    CHECK_INT_EQ(moe_tensor_numel(&t), 1);
    CHECK(t.data != NULL);
    moe_tensor_free(&t);
    int64_t empty[2] = {4, 0};
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_F32, 2, empty, &err), MOE_OK);
    CHECK_INT_EQ(moe_tensor_nbytes(&t), 0);
    moe_tensor_free(&t);

    /* bad shapes */
    int64_t neg[2] = {3, -1};
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_F32, 2, neg, &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "negative") != NULL);
    CHECK(t.data == NULL);
    moe_err_clear(&err);
    int64_t huge[4] = {INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31, 4};
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_F32, 4, huge, &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "too large") != NULL);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_tensor_alloc(&t, MOE_DTYPE_F32, 5, dims, &err), MOE_ERR_INPUT);
    moe_err_clear(&err);

    CHECK(moe_aligned_alloc(0) == NULL);
    void *p = moe_aligned_alloc(1);
    CHECK(p != NULL && (uintptr_t)p % MOE_ALIGN == 0);
    moe_aligned_free(p);
}

static void test_views(void) {
    moe_err err;
    moe_err_clear(&err);
    float data[24];
    for (int i = 0; i < 24; i++)
        data[i] = (float)i;
    int64_t dims[2] = {4, 6};
    moe_tensor t = moe_tensor_wrap(data, MOE_DTYPE_F32, 2, dims, MOE_DEV_CPU), v, w;
    CHECK(!t.owns && moe_tensor_is_contiguous(&t));

    int64_t r3[3] = {2, 3, 4};
    CHECK_INT_EQ(moe_tensor_reshape(&v, &t, 3, r3, &err), MOE_OK);
    CHECK(*(float *)moe_tensor_at(&v, 1, 2, 3, 0) == 12 + 8 + 3);
    int64_t bad[2] = {5, 5};
    CHECK_INT_EQ(moe_tensor_reshape(&v, &t, 2, bad, &err), MOE_ERR_INPUT);
    moe_err_clear(&err);

    /* narrow rows 1..3 of [4, 6]: still contiguous */
    CHECK_INT_EQ(moe_tensor_narrow(&v, &t, 0, 1, 2, &err), MOE_OK);
    CHECK(moe_tensor_is_contiguous(&v) && *(float *)moe_tensor_at(&v, 0, 0, 0, 0) == 6.0f);
    /* narrow columns 2..5: not contiguous, element (1, 1) is data[1*6 + 3] */
    CHECK_INT_EQ(moe_tensor_narrow(&v, &t, 1, 2, 3, &err), MOE_OK);
    CHECK(!moe_tensor_is_contiguous(&v));
    CHECK(*(float *)moe_tensor_at(&v, 1, 1, 0, 0) == 9.0f);
    CHECK_INT_EQ(moe_tensor_reshape(&w, &v, 1, r3, &err), MOE_ERR_INPUT);
    CHECK(strstr(err.msg, "non-contiguous") != NULL);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_tensor_narrow(&v, &t, 1, 4, 3, &err), MOE_ERR_INPUT);
    moe_err_clear(&err);
    CHECK_INT_EQ(moe_tensor_narrow(&v, &t, 2, 0, 1, &err), MOE_ERR_INPUT);
    moe_err_clear(&err);

    /* transpose [4, 6] -> [6, 4]; (j, i) reads data[i*6 + j] */
    CHECK_INT_EQ(moe_tensor_transpose(&v, &t, 0, 1, &err), MOE_OK);
    CHECK(v.dims[0] == 6 && v.dims[1] == 4 && !moe_tensor_is_contiguous(&v));
    CHECK(*(float *)moe_tensor_at(&v, 5, 2, 0, 0) == 2 * 6 + 5);
    CHECK_INT_EQ(moe_tensor_transpose(&v, &t, 0, 2, &err), MOE_ERR_INPUT);
    moe_err_clear(&err);
    /* size-1 dims do not break contiguity */
    int64_t d1[3] = {1, 24, 1};
    CHECK_INT_EQ(moe_tensor_reshape(&v, &t, 3, d1, &err), MOE_OK);
    CHECK_INT_EQ(moe_tensor_transpose(&w, &v, 0, 2, &err), MOE_OK);
    CHECK(moe_tensor_is_contiguous(&w));
    /* views never own, free is a no-op on them */
    moe_tensor_free(&w);
    CHECK(data[23] == 23.0f);
    moe_tensor c = moe_tensor_wrap(NULL, MOE_DTYPE_BF16, 1, dims, MOE_DEV_CUDA);
    char buf[64];
    CHECK(strcmp(moe_tensor_describe(&c, buf, sizeof buf), "bf16[4] cuda") == 0);
}

int main(void) {
    test_alloc();
    test_views();
    return test_summary("test_tensor");
}
