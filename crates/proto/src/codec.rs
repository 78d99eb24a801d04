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

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
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
