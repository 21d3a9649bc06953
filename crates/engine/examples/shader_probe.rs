//! Times an arbitrary matmul-shaped WGSL kernel file (same bindings as matmul.wgsl) for kernel tuning:
//! `cargo run --release -p domino-engine --example shader_probe -- FILE.wgsl COLS_PER_INVOCATION [ELEM_BYTES]`
use domino_engine::context::{Access, KernelSpec};
use domino_engine::shader::Defines;
use domino_engine::{BackendChoice, Gpu, GpuOptions, Step};
use std::time::Instant;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct P { k: u32, n_rows: u32, xo: u32, xs: u32, yo: u32, ys: u32, col0: u32, cols: u32, wcols: u32, acc: u32, pad: [u32; 2] }

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let src: &'static str = Box::leak(std::fs::read_to_string(&args[1]).unwrap().into_boxed_str());
    let per: u32 = args[2].parse().unwrap();
    let elem: u64 = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(4);
    let wg: u32 = args.get(4).map(|s| s.parse().unwrap()).unwrap_or(64);
    let gpu = pollster::block_on(Gpu::new(&GpuOptions { backend: BackendChoice::Vulkan, ..Default::default() })).unwrap();
    let spec = KernelSpec { name: "probe", source: src, entry: "main", bindings: &[(1, Access::Read), (2, Access::Read), (3, Access::ReadWrite)] };
    let pipe = gpu.pipeline(&spec, &Defines::default()).unwrap();
    let env = |v: &str, d: u32| std::env::var(v).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
    let (k, n) = (env("K", 1024), env("N", 8192));
    let w = gpu.buffer("w", k as u64 * n as u64 * elem).unwrap();
    let x = gpu.buffer("x", k as u64 * 4 * 8).unwrap();
    let y = gpu.buffer("y", n as u64 * 4 * 8).unwrap();
    let p = P { k, n_rows: 1, xo: 0, xs: k, yo: 0, ys: n, col0: 0, cols: n, wcols: n, acc: 0, pad: [0; 2] };
    let iters = 20;
    let run = || {
        let mut step = Step::new(&gpu);
        for _ in 0..iters {
            step.dispatch(&pipe, &p, &[&x, &w, &y], [(n / per).div_ceil(wg), 1, 1]);
        }
        pollster::block_on(step.submit_and_read(&y, 0, 4)).unwrap();
    };
    run();
    let t = Instant::now();
    run();
    let dt = t.elapsed().as_secs_f64() / iters as f64;
    println!("{}: {:.3} ms, {:.2} GB/s", args[1], dt * 1e3, (k as u64 * n as u64 * elem) as f64 / dt / 1e9);
}
