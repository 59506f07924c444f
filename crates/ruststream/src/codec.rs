//! How a message is encoded into, and decoded from, the payload column.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A message encoding.
pub trait Codec: Send + Sync + 'static {
    /// Decodes a message.
    fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, String>;
    /// Encodes a message.
    fn encode<M: Serialize>(message: &M) -> Result<Vec<u8>, String>;
}

/// JSON by serde: the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl Codec for Json {
    fn decode<M: DeserializeOwned>(bytes: &[u8]) -> Result<M, String> {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }

    fn encode<M: Serialize>(message: &M) -> Result<Vec<u8>, String> {
        serde_json::to_vec(message).map_err(|e| e.to_string())
    }
}
