// LayerNorm's and RMSNorm's formulas, shared by norm.comp (a workgroup per row) and
// matmul_gemv.comp's norm prologue (norm_linear: each workgroup normalizes the rows it reads),
// so both give a row the same statistics from the same sums. The caller sums over the row's d
// values in a fixed order of its own:
//  - layernorm's mean from the sum of x[i] - x[0]: summed relative to the row's first element,
//    the differences are exact when the values are close (a large mean), so the sum does not
//    lose the spread's digits. RMSNorm's mean is 0 (no centring, no bias);
//  - rstd from the sum of the centred squares (x[i] - mean)^2: a second pass, which keeps the
//    variance accurate when the mean is large against the spread (biased: over d).
// Then x[i] normalizes to norm_scale(x[i], mean, rstd, weight[i]), plus bias[i] for layernorm.

float norm_mean(float shift, float shifted_sum, uint d) { return shift + shifted_sum / float(d); }

float norm_rstd(float centred_squares, uint d, float eps) {
    return 1.0 / sqrt(centred_squares / float(d) + eps);
}

float norm_scale(float v, float mean, float rstd, float weight) {
    return (v - mean) * rstd * weight;
}
vec4 norm_scale(vec4 v, float mean, float rstd, vec4 weight) {
    return (v - mean) * rstd * weight;  // norm_scale() of each component
}
