//! The gRPC codec of Sluice's services: prost's, with every received
//! message's repeated entries counted before it is decoded
//! ([`crate::entries`]).
//!
//! tonic decodes a message whole (up to 4 MiB) before a handler sees it, and
//! an empty entry of a repeated field is 2 bytes on the wire but a few
//! hundred decoded: a `GetManyRequest` or `GetStreamRequest` full of them
//! made the agent allocate ~100x the message. A message with more than
//! [`MOST_ENTRIES`] entries in one top-level field is refused undecoded,
//! INVALID_ARGUMENT; no message of Sluice's comes near that (a batch has at
//! most 1024 items, a listing page 1000 objects).

use std::marker::PhantomData;

use bytes::Buf;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Most entries one top-level field of a received message may have.
pub const MOST_ENTRIES: usize = 16_384;

/// prost's codec, counting before it decodes.
#[derive(Debug, Clone)]
pub struct CountedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for CountedCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for CountedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CountedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CountedDecoder(ProstDecoder::default())
    }
}

/// Counts, then decodes with prost.
#[derive(Debug, Clone)]
pub struct CountedDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for CountedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        // tonic hands a message over in one buffer; were it ever in pieces,
        // prost's own checks are what is left.
        let bytes = buf.chunk();
        if bytes.len() == buf.remaining() {
            check(bytes)?;
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

fn check(bytes: &[u8]) -> Result<(), Status> {
    match crate::entries::most_in_one_field(bytes) {
        Ok(n) if n > MOST_ENTRIES => Err(Status::invalid_argument(format!(
            "a message with {n} entries in one field; at most {MOST_ENTRIES} (refused undecoded)"
        ))),
        Ok(_) => Ok(()),
        // prost says what is wrong with it, as it would have.
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{GetItem, GetManyRequest};
    use prost::Message;

    #[test]
    fn a_message_of_empty_entries_is_refused_and_a_real_batch_is_not() {
        let flood = [0x22, 0x00].repeat(1 << 20); // items (4): 2 bytes each
        let e = check(&flood).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("1048576 entries"), "{}", e.message());
        let batch = GetManyRequest { items: vec![GetItem::default(); 1024], ..Default::default() };
        assert_eq!(crate::entries::most_in_one_field(&batch.encode_to_vec()).unwrap(), 1024);
        check(&batch.encode_to_vec()).unwrap();
    }
}
