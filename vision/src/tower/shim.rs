//! TEMPORARY until the lead's packs change lands (packs::names::visual, Pack::f32_tensor).
pub mod visual {
    pub const PATCH_EMBED: &str = "model.visual.patch_embed.proj.weight";
    pub const PATCH_EMBED_BIAS: &str = "model.visual.patch_embed.proj.bias";
    pub const POS_EMBED: &str = "model.visual.pos_embed.weight";
    pub fn block(i: usize, suffix: &str) -> String {
        format!("model.visual.blocks.{i}.{suffix}")
    }
    pub fn merger(suffix: &str) -> String {
        format!("model.visual.merger.{suffix}")
    }
    pub fn deepstack_merger(j: usize, suffix: &str) -> String {
        format!("model.visual.deepstack_merger_list.{j}.{suffix}")
    }
}
pub trait F32Tensor {
    fn f32_tensor(&self, name: &str) -> Result<&[f32], packs::PackError>;
}
impl F32Tensor for packs::Pack {
    fn f32_tensor(&self, name: &str) -> Result<&[f32], packs::PackError> {
        Ok(bytemuck::cast_slice(self.bytes(name)?))
    }
}
