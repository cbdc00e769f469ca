/* One side of bench/ab_gemm.sh: a ptrain.h tree (old or new, -I its directory)
   compiled static, so two trees' GEMM drivers link into one binary. AB_SIDE
   names the side's entry point: old_gemm or new_gemm. */
#define PTRAIN_STATIC
#define PTRAIN_IMPLEMENTATION
#include "ptrain.h"

#define AB_CAT2(a, b) a##b
#define AB_CAT(a, b) AB_CAT2(a, b)

static pt_ctx ab_ctx[2]; /* fp32, bf16 */

/* C = op(A) op(B) + beta C (row-major) at the precision bf16 selects, as the
   model's kernels call pt_sgemm and pt_gemm_bf16 */
void AB_CAT(AB_SIDE, _gemm)(int bf16, int ta, int tb, int M, int N, int K, const float *A,
                            int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (!ab_ctx[0].ws) {
        pt_ctx_desc d;
        memset(&d, 0, sizeof d);
        if (pt_ctx_init(&ab_ctx[0], &d) != PT_OK) exit(2);
        d.precision = PT_PRECISION_BF16;
        if (pt_ctx_init(&ab_ctx[1], &d) != PT_OK) exit(2);
    }
    if (bf16) pt_gemm_bf16(&ab_ctx[1], ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
    else pt_sgemm(&ab_ctx[0], ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
