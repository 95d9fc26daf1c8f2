// The rotary embedding's angle, shared by rope.comp and the decode attention that rotates q and
// k as it reads them (attention_split.comp, attention_combine.comp).
//
// The angle pos * inv_freq is reduced exactly, without fp64: the table holds each frequency
// in turns per position as a 64-bit fixed-point fraction F (host-computed in double), so
// pos * F mod 2^64 (32x64-bit integer product) is the angle's fraction of a turn. Its top 3
// bits are the octant, the rest a point in the octant, whose sine and cosine come from short
// Taylor polynomials on [0, pi/4] (accurate to an ulp, whatever the driver's sin/cos).

// Sine and cosine of position p times the frequency whose table words are (f_lo, f_hi).
void rope_sin_cos(int p, uint f_lo, uint f_hi, out float sn, out float cs) {
    // turns = pos * F mod 2^64, pos sign-extended to 64 bits.
    uint hi, lo;
    umulExtended(uint(p), f_lo, hi, lo);
    hi += uint(p) * f_hi + (p < 0 ? 0xFFFFFFFFu : 0u) * f_lo;

    const uint octant = hi >> 29;
    uint r_hi = hi & 0x1FFFFFFFu, r_lo = lo;
    if ((octant & 1u) != 0u) {  // odd octants measure from the octant's far end: 2^61 - r
        r_hi = 0x20000000u - r_hi - (r_lo != 0u ? 1u : 0u);
        r_lo = 0u - r_lo;
    }
    const float a = (float(r_hi) * exp2(-29.0) + float(r_lo) * exp2(-61.0)) * 0.78539816339744831;
    const float a2 = a * a;
    const float s = a * (1.0 + a2 * (-1.0 / 6.0 + a2 * (1.0 / 120.0 + a2 * (-1.0 / 5040.0 + a2 * (1.0 / 362880.0)))));
    const float c = 1.0 + a2 * (-0.5 + a2 * (1.0 / 24.0 + a2 * (-1.0 / 720.0 + a2 * (1.0 / 40320.0 + a2 * (-1.0 / 3628800.0)))));
    // angle = octant * pi/4 + (odd ? pi/4 - a : a)
    switch (octant) {
        case 0u: sn = s; cs = c; break;
        case 1u: sn = c; cs = s; break;
        case 2u: sn = c; cs = -s; break;
        case 3u: sn = s; cs = -c; break;
        case 4u: sn = -s; cs = -c; break;
        case 5u: sn = -c; cs = -s; break;
        case 6u: sn = -c; cs = s; break;
        default: sn = -s; cs = c; break;
    }
}

// Sine and cosine of frequency i at token n's position: needs `int pos[]`, `uint table[]` (the
// frequencies' words, lo then hi) and pc.off_pos, pc.off_table in scope.
void rope_token_sin_cos(uint n, uint i, out float sn, out float cs) {
    rope_sin_cos(pos[pc.off_pos + n], table[pc.off_table + 2 * i],
                 table[pc.off_table + 2 * i + 1], sn, cs);
}

// Element c of a head rotated (rotate-half pairs (i, i + half)): x is its own value, partner
// the pair's other element.
float rope_rotated(float x, float partner, bool first_half, float sn, float cs) {
    return first_half ? x * cs - partner * sn : x * cs + partner * sn;
}

// The other element of c's pair in a head of hd elements.
uint rope_partner(uint c, uint hd) { return c < hd / 2 ? c + hd / 2 : c - hd / 2; }

// Element c (of hd) of token n's head rotated, one element at a time (for shaders that read a
// head as they need it): x its value, partner rope_partner(c, hd)'s.
float rope_element(float x, float partner, uint n, uint c, uint hd) {
    float sn, cs;
    rope_token_sin_cos(n, c % (hd / 2), sn, cs);
    return rope_rotated(x, partner, c < hd / 2, sn, cs);
}
