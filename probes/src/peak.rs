//! The host's peak multiply-add rate for the instruction mixes the GEMM kernels use, measured by
//! loops of those instructions alone (register operands, independent accumulator chains, no
//! memory), run on every thread at once: the ceiling a GEMM's GMAC/s is set against.
//!
//! The loops are inline assembly so the compiler can neither hoist the loop-invariant products nor
//! pick other instructions: the figure is the one of the named instructions.

use std::time::Instant;

/// One instruction mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeakMix {
    /// `vfmadd231ps` on ymm: 8 f32 multiply-adds per instruction.
    F32FmaYmm,
    /// `vmulps` + `vaddps` on ymm (the f32/bf16 kernels' form, kept unfused for their exact sums).
    F32MulAddYmm,
    /// `vpmaddubsw` + `vpmaddwd` + `vpaddd` on ymm: 32 u8 x i8 products per triple (the AVX2 i8
    /// kernels).
    I8Avx2Ymm,
    /// `vpmaddwd` + `vpaddd` on ymm: 16 i16 x i16 products per pair (the AVX2 i8 kernel for many
    /// rows, on codes widened to i16).
    I8MaddwdYmm,
    /// `vpdpbusd` on ymm: 32 products (the VNNI kernels' GEMVs).
    I8VnniYmm,
    /// `vpdpbusd` on zmm: 64 products (the VNNI kernels for many rows, `wide.rs`).
    I8VnniZmm,
    /// `vfmadd231ps` on zmm: 16 f32 multiply-adds per instruction (the f32 attention kernel's
    /// AVX-512 path, `compute::attention`).
    F32FmaZmm,
    /// `vdpbf16ps` on zmm: 32 bf16 products with f32 accumulation per instruction (AVX-512 BF16).
    Bf16DotZmm,
}

impl PeakMix {
    pub const ALL: [PeakMix; 8] = [
        PeakMix::F32FmaYmm,
        PeakMix::F32MulAddYmm,
        PeakMix::I8Avx2Ymm,
        PeakMix::I8MaddwdYmm,
        PeakMix::I8VnniYmm,
        PeakMix::I8VnniZmm,
        PeakMix::F32FmaZmm,
        PeakMix::Bf16DotZmm,
    ];

    /// The key in reports.
    pub fn name(self) -> &'static str {
        match self {
            PeakMix::F32FmaYmm => "f32_fma_ymm",
            PeakMix::F32MulAddYmm => "f32_mul_add_ymm",
            PeakMix::I8Avx2Ymm => "i8_avx2_maddubs_madd_add_ymm",
            PeakMix::I8MaddwdYmm => "i8_avx2_i16_madd_add_ymm",
            PeakMix::I8VnniYmm => "i8_vnni_dpbusd_ymm",
            PeakMix::I8VnniZmm => "i8_vnni_dpbusd_zmm",
            PeakMix::F32FmaZmm => "f32_fma_zmm",
            PeakMix::Bf16DotZmm => "bf16_dpbf16ps_zmm",
        }
    }

    /// Whether this CPU runs the mix.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let vnni = is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            match self {
                PeakMix::F32FmaYmm => {
                    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
                }
                PeakMix::F32MulAddYmm | PeakMix::I8Avx2Ymm | PeakMix::I8MaddwdYmm => {
                    is_x86_feature_detected!("avx2")
                }
                PeakMix::I8VnniYmm | PeakMix::I8VnniZmm => vnni,
                PeakMix::F32FmaZmm => {
                    is_x86_feature_detected!("avx2")
                        && is_x86_feature_detected!("fma")
                        && is_x86_feature_detected!("avx512f")
                }
                PeakMix::Bf16DotZmm => compute::kernels::bf16_dot::has_avx512_bf16(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// Multiply-adds one loop iteration does.
    fn macs_per_iteration(self) -> u64 {
        match self {
            PeakMix::F32FmaYmm => 10 * 8,
            PeakMix::F32MulAddYmm => 6 * 8,
            PeakMix::I8Avx2Ymm => 6 * 32,
            PeakMix::I8MaddwdYmm => 12 * 16,
            PeakMix::I8VnniYmm => 10 * 32,
            PeakMix::I8VnniZmm => 10 * 64,
            PeakMix::F32FmaZmm => 10 * 16,
            PeakMix::Bf16DotZmm => 10 * 32,
        }
    }

    /// `iterations` of the loop on this thread.
    fn run(self, iterations: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            assert!(self.available(), "{} is not available", self.name());
            // SAFETY: `available()` (asserted just above) checked each function's target
            // features, except AVX2 for the VNNI and BF16 mixes, which every CPU with AVX-512 F
            // has;
            // the loops touch registers only (`nomem`, `nostack`, every register written declared).
            unsafe {
                match self {
                    PeakMix::F32FmaYmm => x86::f32_fma_ymm(iterations),
                    PeakMix::F32MulAddYmm => x86::f32_mul_add_ymm(iterations),
                    PeakMix::I8Avx2Ymm => x86::i8_avx2_ymm(iterations),
                    PeakMix::I8MaddwdYmm => x86::i8_madd_ymm(iterations),
                    PeakMix::I8VnniYmm => x86::i8_vnni_ymm(iterations),
                    PeakMix::I8VnniZmm => x86::i8_vnni_zmm(iterations),
                    PeakMix::F32FmaZmm => x86::f32_fma_zmm(iterations),
                    PeakMix::Bf16DotZmm => x86::bf16_dot_zmm(iterations),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = iterations;
        }
    }

    /// GMAC/s of `threads` threads running the loop together: the best of `passes` passes of about
    /// 20 ms each (the best pass is the one least disturbed by other processes).
    pub fn measure(self, threads: usize, passes: usize) -> Option<f64> {
        if !self.available() {
            return None;
        }
        // Calibrate one pass to ~20 ms on one thread.
        let mut iterations = 1u64 << 16;
        loop {
            let t = Instant::now();
            self.run(iterations);
            let dt = t.elapsed().as_secs_f64();
            if dt > 2e-3 || iterations >= 1 << 32 {
                iterations = ((iterations as f64) * 20e-3 / dt.max(1e-9)).max(1.0) as u64;
                break;
            }
            iterations *= 4;
        }
        let mut best = 0f64;
        for _ in 0..passes.max(1) {
            let t = Instant::now();
            std::thread::scope(|s| {
                for _ in 0..threads.max(1) {
                    s.spawn(|| self.run(iterations));
                }
            });
            let dt = t.elapsed().as_secs_f64();
            let macs = (threads.max(1) as u64 * iterations * self.macs_per_iteration()) as f64;
            best = best.max(macs / dt / 1e9);
        }
        Some(best)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;

    /// 10 independent `vfmadd231ps` chains (ymm6..ymm15 += ymm0 * ymm1).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32_fma_ymm(n: u64) {
        asm!(
            "vxorps ymm0, ymm0, ymm0",
            "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm6, ymm6, ymm6", "vxorps ymm7, ymm7, ymm7", "vxorps ymm8, ymm8, ymm8",
            "vxorps ymm9, ymm9, ymm9", "vxorps ymm10, ymm10, ymm10", "vxorps ymm11, ymm11, ymm11",
            "vxorps ymm12, ymm12, ymm12", "vxorps ymm13, ymm13, ymm13", "vxorps ymm14, ymm14, ymm14",
            "vxorps ymm15, ymm15, ymm15",
            "2:",
            "vfmadd231ps ymm6, ymm0, ymm1", "vfmadd231ps ymm7, ymm0, ymm1",
            "vfmadd231ps ymm8, ymm0, ymm1", "vfmadd231ps ymm9, ymm0, ymm1",
            "vfmadd231ps ymm10, ymm0, ymm1", "vfmadd231ps ymm11, ymm0, ymm1",
            "vfmadd231ps ymm12, ymm0, ymm1", "vfmadd231ps ymm13, ymm0, ymm1",
            "vfmadd231ps ymm14, ymm0, ymm1", "vfmadd231ps ymm15, ymm0, ymm1",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("ymm0") _, out("ymm1") _, out("ymm6") _, out("ymm7") _, out("ymm8") _,
            out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
            out("ymm14") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// 6 chains of `vmulps` then `vaddps` (ymm2..ymm7 = ymm0 * ymm1; ymm8..ymm13 += them).
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn f32_mul_add_ymm(n: u64) {
        asm!(
            "vxorps ymm0, ymm0, ymm0",
            "vxorps ymm1, ymm1, ymm1",
            "vxorps ymm8, ymm8, ymm8", "vxorps ymm9, ymm9, ymm9", "vxorps ymm10, ymm10, ymm10",
            "vxorps ymm11, ymm11, ymm11", "vxorps ymm12, ymm12, ymm12", "vxorps ymm13, ymm13, ymm13",
            "2:",
            "vmulps ymm2, ymm0, ymm1", "vmulps ymm3, ymm0, ymm1", "vmulps ymm4, ymm0, ymm1",
            "vmulps ymm5, ymm0, ymm1", "vmulps ymm6, ymm0, ymm1", "vmulps ymm7, ymm0, ymm1",
            "vaddps ymm8, ymm8, ymm2", "vaddps ymm9, ymm9, ymm3", "vaddps ymm10, ymm10, ymm4",
            "vaddps ymm11, ymm11, ymm5", "vaddps ymm12, ymm12, ymm6", "vaddps ymm13, ymm13, ymm7",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
            options(nostack, nomem),
        );
    }

    /// 6 chains of `vpmaddubsw` (u8 x i8 pairs to i16), `vpmaddwd` by ones (to i32), `vpaddd`
    /// into an accumulator: the AVX2 i8 kernels' dot product.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn i8_avx2_ymm(n: u64) {
        asm!(
            "vpxor ymm0, ymm0, ymm0",
            "vpxor ymm1, ymm1, ymm1",
            "vpcmpeqw ymm15, ymm15, ymm15",
            "vpsrlw ymm15, ymm15, 15",
            "vpxor ymm8, ymm8, ymm8", "vpxor ymm9, ymm9, ymm9", "vpxor ymm10, ymm10, ymm10",
            "vpxor ymm11, ymm11, ymm11", "vpxor ymm12, ymm12, ymm12", "vpxor ymm13, ymm13, ymm13",
            "2:",
            "vpmaddubsw ymm2, ymm0, ymm1", "vpmaddubsw ymm3, ymm0, ymm1",
            "vpmaddubsw ymm4, ymm0, ymm1", "vpmaddubsw ymm5, ymm0, ymm1",
            "vpmaddubsw ymm6, ymm0, ymm1", "vpmaddubsw ymm7, ymm0, ymm1",
            "vpmaddwd ymm2, ymm2, ymm15", "vpmaddwd ymm3, ymm3, ymm15",
            "vpmaddwd ymm4, ymm4, ymm15", "vpmaddwd ymm5, ymm5, ymm15",
            "vpmaddwd ymm6, ymm6, ymm15", "vpmaddwd ymm7, ymm7, ymm15",
            "vpaddd ymm8, ymm8, ymm2", "vpaddd ymm9, ymm9, ymm3", "vpaddd ymm10, ymm10, ymm4",
            "vpaddd ymm11, ymm11, ymm5", "vpaddd ymm12, ymm12, ymm6", "vpaddd ymm13, ymm13, ymm7",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// 12 chains of `vpmaddwd` (i16 pairs to i32) then `vpaddd` into an accumulator: the AVX2 i8
    /// kernel for many rows.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn i8_madd_ymm(n: u64) {
        asm!(
            "vpxor ymm0, ymm0, ymm0",
            "vpxor ymm1, ymm1, ymm1",
            "vpxor ymm4, ymm4, ymm4", "vpxor ymm5, ymm5, ymm5", "vpxor ymm6, ymm6, ymm6",
            "vpxor ymm7, ymm7, ymm7", "vpxor ymm8, ymm8, ymm8", "vpxor ymm9, ymm9, ymm9",
            "vpxor ymm10, ymm10, ymm10", "vpxor ymm11, ymm11, ymm11", "vpxor ymm12, ymm12, ymm12",
            "vpxor ymm13, ymm13, ymm13", "vpxor ymm14, ymm14, ymm14", "vpxor ymm15, ymm15, ymm15",
            "2:",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm4, ymm4, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm5, ymm5, ymm3",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm6, ymm6, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm7, ymm7, ymm3",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm8, ymm8, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm9, ymm9, ymm3",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm10, ymm10, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm11, ymm11, ymm3",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm12, ymm12, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm13, ymm13, ymm3",
            "vpmaddwd ymm2, ymm0, ymm1", "vpaddd ymm14, ymm14, ymm2",
            "vpmaddwd ymm3, ymm0, ymm1", "vpaddd ymm15, ymm15, ymm3",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
            out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _, out("ymm14") _,
            out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// 10 independent `vpdpbusd` chains on ymm.
    ///
    /// # Safety
    /// The CPU must support AVX2, AVX-512 F, AVX-512 VL and AVX-512 VNNI (the function's target
    /// features; the loop itself needs VL and VNNI).
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    pub unsafe fn i8_vnni_ymm(n: u64) {
        asm!(
            "vpxor ymm0, ymm0, ymm0",
            "vpxor ymm1, ymm1, ymm1",
            "vpxor ymm6, ymm6, ymm6", "vpxor ymm7, ymm7, ymm7", "vpxor ymm8, ymm8, ymm8",
            "vpxor ymm9, ymm9, ymm9", "vpxor ymm10, ymm10, ymm10", "vpxor ymm11, ymm11, ymm11",
            "vpxor ymm12, ymm12, ymm12", "vpxor ymm13, ymm13, ymm13", "vpxor ymm14, ymm14, ymm14",
            "vpxor ymm15, ymm15, ymm15",
            "2:",
            "vpdpbusd ymm6, ymm0, ymm1", "vpdpbusd ymm7, ymm0, ymm1",
            "vpdpbusd ymm8, ymm0, ymm1", "vpdpbusd ymm9, ymm0, ymm1",
            "vpdpbusd ymm10, ymm0, ymm1", "vpdpbusd ymm11, ymm0, ymm1",
            "vpdpbusd ymm12, ymm0, ymm1", "vpdpbusd ymm13, ymm0, ymm1",
            "vpdpbusd ymm14, ymm0, ymm1", "vpdpbusd ymm15, ymm0, ymm1",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("ymm0") _, out("ymm1") _, out("ymm6") _, out("ymm7") _, out("ymm8") _,
            out("ymm9") _, out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
            out("ymm14") _, out("ymm15") _,
            options(nostack, nomem),
        );
    }

    /// 10 independent `vpdpbusd` chains on zmm.
    ///
    /// # Safety
    /// The CPU must support AVX2, AVX-512 F, AVX-512 VL and AVX-512 VNNI (the function's target
    /// features; the loop itself needs F and VNNI).
    #[target_feature(enable = "avx2,avx512f,avx512vl,avx512vnni")]
    pub unsafe fn i8_vnni_zmm(n: u64) {
        asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7", "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9", "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12", "vpxord zmm13, zmm13, zmm13", "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "2:",
            "vpdpbusd zmm6, zmm0, zmm1", "vpdpbusd zmm7, zmm0, zmm1",
            "vpdpbusd zmm8, zmm0, zmm1", "vpdpbusd zmm9, zmm0, zmm1",
            "vpdpbusd zmm10, zmm0, zmm1", "vpdpbusd zmm11, zmm0, zmm1",
            "vpdpbusd zmm12, zmm0, zmm1", "vpdpbusd zmm13, zmm0, zmm1",
            "vpdpbusd zmm14, zmm0, zmm1", "vpdpbusd zmm15, zmm0, zmm1",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("zmm0") _, out("zmm1") _, out("zmm6") _, out("zmm7") _, out("zmm8") _,
            out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _,
            out("zmm14") _, out("zmm15") _,
            options(nostack, nomem),
        );
    }
    /// 10 independent `vfmadd231ps` chains on zmm (zmm6..zmm15 += zmm0 * zmm1).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and AVX-512 F.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn f32_fma_zmm(n: u64) {
        asm!(
            "vxorps zmm0, zmm0, zmm0",
            "vxorps zmm1, zmm1, zmm1",
            "vxorps zmm6, zmm6, zmm6", "vxorps zmm7, zmm7, zmm7", "vxorps zmm8, zmm8, zmm8",
            "vxorps zmm9, zmm9, zmm9", "vxorps zmm10, zmm10, zmm10", "vxorps zmm11, zmm11, zmm11",
            "vxorps zmm12, zmm12, zmm12", "vxorps zmm13, zmm13, zmm13", "vxorps zmm14, zmm14, zmm14",
            "vxorps zmm15, zmm15, zmm15",
            "2:",
            "vfmadd231ps zmm6, zmm0, zmm1", "vfmadd231ps zmm7, zmm0, zmm1",
            "vfmadd231ps zmm8, zmm0, zmm1", "vfmadd231ps zmm9, zmm0, zmm1",
            "vfmadd231ps zmm10, zmm0, zmm1", "vfmadd231ps zmm11, zmm0, zmm1",
            "vfmadd231ps zmm12, zmm0, zmm1", "vfmadd231ps zmm13, zmm0, zmm1",
            "vfmadd231ps zmm14, zmm0, zmm1", "vfmadd231ps zmm15, zmm0, zmm1",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("zmm0") _, out("zmm1") _, out("zmm6") _, out("zmm7") _, out("zmm8") _,
            out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _,
            out("zmm14") _, out("zmm15") _,
            options(nostack, nomem),
        );
    }

    /// 10 independent `vdpbf16ps` chains on zmm (zmm6..zmm15 += the bf16 pair dots of zmm0
    /// and zmm1; zeros, so no denormal or overflow path).
    ///
    /// # Safety
    /// The CPU must support AVX2, AVX-512 F and AVX-512 BF16.
    #[target_feature(enable = "avx2,avx512f,avx512bf16")]
    pub unsafe fn bf16_dot_zmm(n: u64) {
        asm!(
            "vpxord zmm0, zmm0, zmm0",
            "vpxord zmm1, zmm1, zmm1",
            "vpxord zmm6, zmm6, zmm6", "vpxord zmm7, zmm7, zmm7", "vpxord zmm8, zmm8, zmm8",
            "vpxord zmm9, zmm9, zmm9", "vpxord zmm10, zmm10, zmm10", "vpxord zmm11, zmm11, zmm11",
            "vpxord zmm12, zmm12, zmm12", "vpxord zmm13, zmm13, zmm13", "vpxord zmm14, zmm14, zmm14",
            "vpxord zmm15, zmm15, zmm15",
            "2:",
            "vdpbf16ps zmm6, zmm0, zmm1", "vdpbf16ps zmm7, zmm0, zmm1",
            "vdpbf16ps zmm8, zmm0, zmm1", "vdpbf16ps zmm9, zmm0, zmm1",
            "vdpbf16ps zmm10, zmm0, zmm1", "vdpbf16ps zmm11, zmm0, zmm1",
            "vdpbf16ps zmm12, zmm0, zmm1", "vdpbf16ps zmm13, zmm0, zmm1",
            "vdpbf16ps zmm14, zmm0, zmm1", "vdpbf16ps zmm15, zmm0, zmm1",
            "dec {n}",
            "jnz 2b",
            n = inout(reg) n.max(1) => _,
            out("zmm0") _, out("zmm1") _, out("zmm6") _, out("zmm7") _, out("zmm8") _,
            out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _,
            out("zmm14") _, out("zmm15") _,
            options(nostack, nomem),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mix this CPU runs gives a rate (no timed claim: only that the loops run and count);
    /// a mix it lacks gives none.
    #[test]
    fn every_available_mix_measures() {
        for mix in PeakMix::ALL {
            match mix.measure(1, 2) {
                Some(r) => assert!(r > 0.1, "{}: {r} GMAC/s", mix.name()),
                None => assert!(!mix.available()),
            }
        }
    }
}
