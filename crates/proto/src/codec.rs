//! The codec of every `spillway.v1` call: prost's, with a first buffer of [`FIRST_BUFFER_BYTES`]
//! each way instead of tonic's 8 KiB.
//!
//! Tonic allocates a decode buffer and an encode buffer of that size for every call when it
//! starts, and again whenever a message has been split off a buffer it still shares. An
//! aggregator holds one link stream per host, each carrying a report of a few hundred bytes up
//! and instructions of a few hundred bytes down a second, and the 16 KiB a stream stayed
//! resident for as long as the host was linked. With 1 KiB buffers (and the aggregator's
//! instructions channel boxed) its RSS fell from 56-58 KB to 44 KB a linked host, 74 to 60 MB
//! at 1,000 hosts and 299 to 237 MB at 5,000 (docs/benchmarks.md). A large message is not held back by a small first buffer: the
//! decoder reserves a whole message's length once its header is read, and the encoder's buffer
//! grows as prost writes into it (doubling), so a report of 100,000 buckets or a large rules file
//! still arrives in one piece.

use std::marker::PhantomData;

use std::sync::Arc;

use bytes::BufMut;
use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The first buffer of each direction of a call, in bytes: a host's report of 10 buckets or its
/// instructions fit.
pub const FIRST_BUFFER_BYTES: usize = 1024;

/// How much an encoded stream gathers before handing it to HTTP/2 (tonic's default).
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

/// Prost's codec with [`FIRST_BUFFER_BYTES`] buffers, named by the generated clients and servers.
#[derive(Debug, Clone, Copy)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(FIRST_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> ProstEncoder<T> {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(settings())
    }
}

/// A message already encoded, sent as it is: the zone's instructions, encoded once per interval
/// and handed to every host whose instructions are the zone's own, each stream holding a
/// reference to the same bytes ([`crate::encoded`]).
///
/// Copying a 10-bucket `Instructions` for each host (21 allocations: the buckets' names and
/// tiers) and encoding each copy was most of what relaying instructions cost an aggregator.
/// One pointer wide, so a stream's channel of them (32 slots allocated at once, for as long as
/// its host stays linked) is no larger than one of boxed messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded(Arc<Vec<u8>>);

impl Encoded {
    /// `message`, encoded.
    pub fn of(message: &impl Message) -> Self {
        Encoded(Arc::new(message.encode_to_vec()))
    }

    /// The encoded message.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Writes an [`Encoded`] message as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct EncodedEncoder;

impl Encoder for EncodedEncoder {
    type Item = Encoded;
    type Error = Status;

    fn encode(&mut self, item: Encoded, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.as_bytes());
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        settings()
    }
}

/// The codec of a call that sends [`Encoded`] messages and receives `U`, decoded by prost, with
/// [`LeanCodec`]'s buffers.
#[derive(Debug, Clone, Copy)]
pub struct EncodedCodec<U>(PhantomData<U>);

impl<U> Default for EncodedCodec<U> {
    fn default() -> Self {
        EncodedCodec(PhantomData)
    }
}

impl<U> Codec for EncodedCodec<U>
where
    U: Message + Default + Send + 'static,
{
    type Encode = Encoded;
    type Decode = U;
    type Encoder = EncodedEncoder;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> EncodedEncoder {
        EncodedEncoder
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstDecoder::new(settings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    #[test]
    fn an_encoded_message_is_the_message_as_prost_encodes_it_and_one_pointer_wide() {
        let instructions = v1::Instructions {
            sequence: 7,
            ttl_ms: 3_000,
            buckets: vec![v1::BucketInstruction {
                service: "api".into(),
                bucket: "b0".into(),
                drop_ratio: 1 << 31,
                ..Default::default()
            }],
            ..Default::default()
        };
        let encoded = Encoded::of(&instructions);
        assert_eq!(encoded.as_bytes(), instructions.encode_to_vec().as_slice());
        assert_eq!(
            v1::Instructions::decode(encoded.as_bytes()).unwrap(),
            instructions
        );
        assert_eq!(
            std::mem::size_of::<Result<Encoded, tonic::Status>>(),
            std::mem::size_of::<Result<Box<v1::Instructions>, tonic::Status>>(),
            "a stream's channel slot is as small as a boxed message's"
        );
    }
}
