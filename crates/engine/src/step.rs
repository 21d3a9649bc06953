//! Command recording: a `Step` collects dispatches (pipeline, buffers, params) and submits them as ONE
//! command buffer. Params of all dispatches go into one uniform buffer at 256-byte slots, bound with
//! dynamic offsets, so bind groups depend only on the buffers and are cached across steps.

use crate::context::{Gpu, GpuBuffer, Pipeline, Resource, PARAMS_SLOT};
use crate::error::{EngineError, Result};
use std::sync::Arc;

struct Dispatch {
    pipeline: Arc<Pipeline>,
    resources: Vec<Resource>,
    slot: u32,
    groups: [u32; 3],
    label: Arc<str>,
    weight_bytes: u64,
}

/// What one recorded dispatch runs: the rows of `domino plan`, read from the recording itself.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DispatchInfo {
    pub kernel: String,
    pub variant: String,
    pub label: String,
    pub workgroup_size: [u32; 3],
    pub workgroups: [u32; 3],
    pub invocations: u64,
    pub weight_bytes: u64,
}

/// One submission's worth of GPU work.
pub struct Step<'g> {
    gpu: &'g Gpu,
    params: Vec<u8>,
    dispatches: Vec<Dispatch>,
    label: Arc<str>,
}

/// Workgroup counts for `threads` invocations in workgroups of `wg`, folded into y past 65535.
/// Shaders recover the flat index as gid.x + gid.y * 65535 * wg.
pub fn flat_groups(threads: u32, wg: u32) -> [u32; 3] {
    let groups = threads.div_ceil(wg).max(1);
    if groups <= 65535 {
        [groups, 1, 1]
    } else {
        [65535, groups.div_ceil(65535), 1]
    }
}

/// The bind-group cache key of a dispatch's resources (with the params buffer): ids and windows.
fn bind_group_key(params: u64, resources: &[Resource]) -> Vec<u64> {
    let mut key = Vec::with_capacity(2 * resources.len() + 1);
    key.push(params);
    key.extend(resources.iter().flat_map(Resource::key));
    key
}

impl<'g> Step<'g> {
    pub fn new(gpu: &'g Gpu) -> Self {
        Self { gpu, params: Vec::new(), dispatches: Vec::new(), label: Arc::from("") }
    }

    /// Name the dispatches recorded from now on ("layer 3 q/k/v"), for `domino plan`.
    pub fn set_label(&mut self, label: &str) {
        self.label = Arc::from(label);
    }

    /// Every dispatch recorded so far, in order.
    pub fn plan(&self) -> Vec<DispatchInfo> {
        self.dispatches
            .iter()
            .map(|d| {
                let wg = d.pipeline.workgroup_size;
                let groups = d.groups;
                let per_group = wg.iter().map(|&v| v as u64).product::<u64>();
                DispatchInfo {
                    kernel: d.pipeline.name.clone(),
                    variant: if d.pipeline.variant.is_empty() { d.pipeline.entry.to_string() } else { format!("{} {}", d.pipeline.entry, d.pipeline.variant) },
                    label: d.label.to_string(),
                    workgroup_size: wg,
                    workgroups: groups,
                    invocations: per_group * groups.iter().map(|&v| v as u64).product::<u64>(),
                    weight_bytes: d.weight_bytes,
                }
            })
            .collect()
    }

    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    pub fn len(&self) -> usize {
        self.dispatches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dispatches.is_empty()
    }

    /// Record one dispatch. `buffers` follow the order of the kernel's declared bindings.
    pub fn dispatch<P: bytemuck::Pod>(&mut self, pipeline: &Arc<Pipeline>, params: &P, buffers: &[&Arc<GpuBuffer>], groups: [u32; 3]) {
        let resources = buffers.iter().map(|b| Resource::Buffer((*b).clone())).collect();
        self.dispatch_resources(pipeline, params, resources, groups);
    }

    /// As `dispatch`, with any mix of buffers and weight textures.
    pub fn dispatch_resources<P: bytemuck::Pod>(&mut self, pipeline: &Arc<Pipeline>, params: &P, resources: Vec<Resource>, groups: [u32; 3]) {
        self.dispatch_weights(pipeline, params, resources, groups, 0);
    }

    /// As `dispatch_resources`, for a dispatch that reads `weight_bytes` of model weights.
    pub fn dispatch_weights<P: bytemuck::Pod>(&mut self, pipeline: &Arc<Pipeline>, params: &P, resources: Vec<Resource>, groups: [u32; 3], weight_bytes: u64) {
        debug_assert_eq!(resources.len(), pipeline.bindings.len(), "kernel {}", pipeline.name);
        let slot = (self.params.len() as u64 / PARAMS_SLOT) as u32;
        let bytes = bytemuck::bytes_of(params);
        self.params.extend_from_slice(bytes);
        self.params.resize(self.params.len().div_ceil(PARAMS_SLOT as usize) * PARAMS_SLOT as usize, 0);
        self.dispatches.push(Dispatch { pipeline: pipeline.clone(), resources, slot, groups, label: self.label.clone(), weight_bytes });
    }

    fn params_buffer(&self) -> Result<Arc<GpuBuffer>> {
        let gpu = self.gpu;
        let needed = (self.params.len() as u64).max(PARAMS_SLOT);
        let mut guard = gpu.params.lock().map_err(|_| EngineError::Gpu("params buffer poisoned".into()))?;
        if let Some(b) = guard.as_ref() {
            if b.size >= needed {
                return Ok(b.clone());
            }
        }
        // Grow (doubling); bind groups that named the old buffer are dropped with it.
        let size = needed.next_power_of_two().max(1 << 16);
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let b = Arc::new(GpuBuffer { id: gpu.next_id(), buffer, size, label: "params".into() });
        *guard = Some(b.clone());
        gpu.clear_bind_groups();
        Ok(b)
    }

    fn encode(self, encoder: &mut wgpu::CommandEncoder) -> Result<()> {
        let gpu = self.gpu;
        let params = self.params_buffer()?;
        if !self.params.is_empty() {
            gpu.queue.write_buffer(&params.buffer, 0, &self.params);
        }
        let mut cache = gpu.bind_groups.lock().map_err(|_| EngineError::Gpu("bind group cache poisoned".into()))?;
        for d in &self.dispatches {
            let key_ids = bind_group_key(params.id, &d.resources);
            let key = (d.pipeline.id, key_ids);
            if !cache.contains_key(&key) {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &params.buffer,
                        offset: 0,
                        size: std::num::NonZeroU64::new(PARAMS_SLOT),
                    }),
                }];
                for (r, &(binding, _)) in d.resources.iter().zip(d.pipeline.bindings) {
                    entries.push(wgpu::BindGroupEntry { binding, resource: r.binding() });
                }
                let bg = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(&d.pipeline.name),
                    layout: &d.pipeline.layout,
                    entries: &entries,
                });
                cache.insert(key.clone(), bg);
            }
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("step"), timestamp_writes: None });
        for d in &self.dispatches {
            let key_ids = bind_group_key(params.id, &d.resources);
            let bg = &cache[&(d.pipeline.id, key_ids)];
            pass.set_pipeline(&d.pipeline.pipeline);
            pass.set_bind_group(0, bg, &[(d.slot as u64 * PARAMS_SLOT) as u32]);
            pass.dispatch_workgroups(d.groups[0], d.groups[1], d.groups[2]);
        }
        Ok(())
    }

    /// Submit without reading anything back.
    pub fn submit(self) -> Result<()> {
        let gpu = self.gpu;
        gpu.check()?;
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        self.encode(&mut encoder)?;
        gpu.queue.submit([encoder.finish()]);
        Ok(())
    }

    /// Submit and read `len` bytes at `offset` of `src` once the work is done (the token ids).
    pub async fn submit_and_read(self, src: &GpuBuffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        let gpu = self.gpu;
        self.submit_with_read(src, offset, len)?.wait(gpu).await
    }

    /// Submit with a copy of `len` bytes of `src` into a staging buffer, without waiting: the caller
    /// can record and submit the next step before `wait`ing for this one (decode pipelining).
    pub fn submit_with_read(self, src: &GpuBuffer, offset: u64, len: u64) -> Result<PendingRead> {
        let gpu = self.gpu;
        gpu.check()?;
        let len4 = len.div_ceil(4) * 4;
        let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: len4.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("step") });
        self.encode(&mut encoder)?;
        encoder.copy_buffer_to_buffer(&src.buffer, offset, &staging, 0, Some(len4));
        let index = gpu.queue.submit([encoder.finish()]);
        let (tx, rx) = futures_channel::oneshot::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        Ok(PendingRead { staging, index, len: len as usize, rx })
    }
}

/// A submitted step whose readback has not been waited for yet.
pub struct PendingRead {
    staging: wgpu::Buffer,
    index: wgpu::SubmissionIndex,
    len: usize,
    rx: futures_channel::oneshot::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl PendingRead {
    /// Wait for this submission only (later ones keep running) and return the bytes.
    pub async fn wait(self, gpu: &Gpu) -> Result<Vec<u8>> {
        // Natively the device must be polled to make progress; the browser drives itself.
        // A lost device (or a GPU error raised by this step) explains a failed readback better
        // than the readback's own error does.
        let failed = |e: String| gpu.check().err().unwrap_or(EngineError::Readback(e));
        #[cfg(not(target_arch = "wasm32"))]
        gpu.device
            .poll(wgpu::PollType::Wait { submission_index: Some(self.index.clone()), timeout: None })
            .map_err(|e| failed(e.to_string()))?;
        #[cfg(target_arch = "wasm32")]
        let _ = &self.index;
        self.rx
            .await
            .map_err(|_| failed("map callback dropped".into()))?
            .map_err(|e| failed(e.to_string()))?;
        gpu.check()?;
        let mut data = self.staging.get_mapped_range(..).map_err(|e| EngineError::Readback(e.to_string()))?.to_vec();
        self.staging.unmap();
        data.truncate(self.len);
        Ok(data)
    }
}

/// Read a whole buffer (tests and debugging; the decode path reads only token ids).
pub async fn read_buffer(gpu: &Gpu, src: &GpuBuffer, offset: u64, len: u64) -> Result<Vec<u8>> {
    Step::new(gpu).submit_and_read(src, offset, len).await
}

pub async fn read_f32(gpu: &Gpu, src: &GpuBuffer, offset_elems: u64, n: usize) -> Result<Vec<f32>> {
    let b = read_buffer(gpu, src, offset_elems * 4, n as u64 * 4).await?;
    Ok(bytemuck::pod_collect_to_vec(&b))
}

/// Wait until all submitted work has finished (timing splits between phases).
pub async fn finish(gpu: &Gpu) -> Result<()> {
    let (tx, rx) = futures_channel::oneshot::channel();
    gpu.queue.on_submitted_work_done(move || {
        let _ = tx.send(());
    });
    #[cfg(not(target_arch = "wasm32"))]
    gpu.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| EngineError::Readback(e.to_string()))?;
    rx.await.map_err(|_| EngineError::Readback("work-done callback dropped".into()))
}
