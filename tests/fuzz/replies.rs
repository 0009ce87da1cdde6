//! The reply scanner and parser (`tollgate_resp::{Scanner, frame_len, parse}`), as a server (or
//! a script's reply) could feed them: any RESP2/RESP3 frame encodes and reads back as itself;
//! measuring a frame in pieces gives what measuring it whole gives; mutated frames end in a
//! length, a wait or a typed error, never a panic; and nesting costs the scanner only bytes.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tollgate_resp::{encode, frame_len, parse, Frame, Limits, ProtocolError, Scanner};

use crate::mutate::{apply, cuts, mutations};
use crate::support::check;

/// Bytes that mean something in a reply.
const SPECIALS: &[u8] = b"*$%~>|=!,#(_+-:\r\n0123456789tf";

fn line() -> impl Strategy<Value = Bytes> {
    "[ -~]{0,16}".prop_map(Bytes::from)
}

fn blob() -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

fn double() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("NaN is not equal to itself", |d| !d.is_nan()),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(0.0),
        Just(1e300),
        Just(-2.5e-300),
    ]
}

/// Any frame the parser builds, nested a few levels.
pub fn frame() -> impl Strategy<Value = Frame> {
    let leaf = prop_oneof![
        line().prop_map(Frame::Simple),
        line().prop_map(Frame::Error),
        blob().prop_map(Frame::BulkError),
        any::<i64>().prop_map(Frame::Integer),
        blob().prop_map(Frame::Bulk),
        Just(Frame::Null),
        Just(Frame::Null3),
        Just(Frame::NullArray),
        double().prop_map(Frame::Double),
        any::<bool>().prop_map(Frame::Boolean),
        "-?[0-9]{1,40}".prop_map(|n| Frame::BigNumber(Bytes::from(n))),
        ("[a-z]{3}", blob()).prop_map(|(format, text)| Frame::Verbatim {
            format: format.as_bytes().try_into().expect("three letters"),
            text,
        }),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        let items = proptest::collection::vec(inner.clone(), 0..6);
        let pairs = proptest::collection::vec((inner.clone(), inner.clone()), 0..4);
        prop_oneof![
            items.clone().prop_map(Frame::Array),
            items.clone().prop_map(Frame::Set),
            items.prop_map(Frame::Push),
            pairs.clone().prop_map(Frame::Map),
            (pairs, inner).prop_map(|(attributes, value)| Frame::Attribute {
                attributes,
                value: Box::new(value),
            }),
        ]
    })
}

fn encoded(frame: &Frame) -> Vec<u8> {
    let mut out = BytesMut::new();
    encode(frame, &mut out);
    out.to_vec()
}

/// The scanner fed `input` in pieces cut at `cuts`, as a lane reads a reply: the first frame's
/// length, a wait, or the error.
fn scan_in_pieces(
    input: &[u8],
    cuts: &[usize],
    limits: &Limits,
) -> Result<Option<usize>, ProtocolError> {
    let mut scanner = Scanner::default();
    for &to in cuts.iter().chain(std::iter::once(&input.len())) {
        if let Some(len) = scanner.scan(&input[..to], limits)? {
            return Ok(Some(len));
        }
    }
    Ok(None)
}

#[test]
fn every_frame_reads_back_as_itself_whole_or_in_pieces() {
    let strategy = (frame(), proptest::collection::vec(any::<usize>(), 0..10));
    check(2048, strategy, |(frame, raw_cuts)| {
        let wire = encoded(&frame);
        let limits = Limits::default();
        prop_assert_eq!(frame_len(&wire, &limits), Ok(Some(wire.len())));
        let cuts = cuts(wire.len(), &raw_cuts);
        prop_assert_eq!(scan_in_pieces(&wire, &cuts, &limits), Ok(Some(wire.len())));
        let mut buf = BytesMut::from(&wire[..]);
        prop_assert_eq!(parse(&mut buf, &limits), Ok(Some(frame)));
        prop_assert!(buf.is_empty());
        Ok(())
    });
}

#[test]
fn mutated_replies_end_in_a_length_a_wait_or_a_typed_error_however_they_arrive() {
    let strategy = (
        proptest::collection::vec(frame(), 1..3),
        mutations(4, SPECIALS),
        proptest::collection::vec(any::<usize>(), 0..10),
    );
    check(2048, strategy, |(frames, mutations, raw_cuts)| {
        let input = apply(frames.iter().flat_map(encoded).collect(), &mutations);
        let limits = Limits {
            max_frame_bytes: 4096,
            max_elements: 64,
            max_depth: 3,
            max_inline_bytes: 64,
        };
        let whole = frame_len(&input, &limits);
        if let Ok(Some(len)) = whole {
            prop_assert!(len > 0 && len <= input.len());
        }
        let cuts = cuts(input.len(), &raw_cuts);
        prop_assert_eq!(&scan_in_pieces(&input, &cuts, &limits), &whole);
        // Building agrees with measuring: a measured frame is built (or refused as too deep)
        // and consumes exactly its length; anything else is left in place.
        let mut buf = BytesMut::from(&input[..]);
        match (parse(&mut buf, &limits), whole) {
            (Ok(Some(_)) | Err(ProtocolError::TooDeep { .. }), Ok(Some(len))) => {
                prop_assert_eq!(buf.len(), input.len() - len);
            }
            (Ok(None), Ok(None)) => prop_assert_eq!(buf.len(), input.len()),
            (Err(built), Err(measured)) => prop_assert_eq!(built, measured),
            (built, measured) => {
                return Err(TestCaseError::fail(format!(
                    "parse gave {built:?}, frame_len {measured:?}"
                )))
            }
        }
        Ok(())
    });
}

#[test]
fn nesting_costs_the_scanner_only_bytes() {
    check(16, 1usize..200_000, |depth| {
        let mut wire = b"*1\r\n".repeat(depth);
        wire.extend_from_slice(b":1\r\n");
        let limits = Limits::default();
        prop_assert_eq!(frame_len(&wire, &limits), Ok(Some(wire.len())));
        let mut buf = BytesMut::from(&wire[..]);
        match parse(&mut buf, &limits) {
            Ok(Some(_)) => prop_assert!(depth <= limits.max_depth),
            Err(ProtocolError::TooDeep { .. }) => prop_assert!(depth > limits.max_depth),
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        }
        prop_assert!(buf.is_empty(), "a too-deep frame is consumed all the same");
        Ok(())
    });
}
