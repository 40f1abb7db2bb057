"""The binary encoding of peer messages and of the records kdsync keeps in Kafka.

One codec serves two purposes: messages between sidecars (each one TCP frame, see
``kdsync.transport.framing``) and the records a data member writes to its internal
topics (log entries, hard state, ledger snapshots). Both outlive a single process:
during a rolling upgrade, peers and stored records may come from another kdsync
version. Every encoding therefore starts with a format version, and a decoder that
meets a version or type it does not know fails with a clear ``WireFormatError``
instead of misreading the bytes.

Layout (all integers big-endian; ``i64`` signed, ``u32`` unsigned)::

    encoding   = version:u8 (=1)  tag:u8  body          (nothing may follow the body)
    names      = UTF-8; each length (u32, in bytes) sits in the fixed part before it
    opt-bytes  = len:i32 bytes[len]                     (len -1 means None)
    bool       = u8, 0 or 1

    tag  body
    1    VoteRequest     term last_index last_term incarnation (4 x i64) transfer (u8)
    2    VoteReply       term:i64 granted:bool incarnation:i64
    3    Append          term prev_index prev_term commit incarnation all_durable
                         (6 x i64)  count:u32  entry[count]
    4    AppendReply     term:i64 success:bool match_index hint_index rejected_index
                         incarnation peer_incarnation applied_index (6 x i64)
    5    Forward         term:i64 count:u32 batch[count]
    6    TimeoutNow      term:i64
    7    RecoverRequest  term:i64 nonce:i64
    8    RecoverReply    term nonce commit_index commit_term (4 x i64) count:u32
                         entry[count]
    9    PreVoteRequest  term last_index last_term incarnation (4 x i64)
    10   PreVoteReply    term:i64 granted:bool incarnation:i64
    11   RecoverRequest  term nonce after_index after_term (4 x i64): a later part
    12   RecoverReply    term nonce commit_index commit_term prev_index prev_term
                         (6 x i64) more:bool count:u32 entry[count]: one part of an
                         answer (8 is a whole answer after the commit index)
    16   Entry record    entry
    17   HardState       term:i64 voted_for:opt-str (as opt-bytes, UTF-8)
    18   LedgerState     applied_index:i64 applied_term:i64
                         marks:u32 (origin_len:u32 topic_len:u32 partition:i32
                                    mark:i64 origin topic)[marks]
                         seqs:u32 (topic_len:u32 next_seq:i64 topic)[seqs]

    entry   = index:i64 term:i64 kind:u8 (0 no-op | 1 batch | 2 config | 3 config+addresses)
              batch? config?
    config  = voters:u16 witnesses:u16 learners:u16 (len:u16 name)[all three];
              with addresses also count:u16 (len:u16 member len:u16 host:port)[count]

    Append, RecoverReply and LedgerState may end with a configuration after a marker byte
    (1 without addresses, 2 with): earlier releases end before it. A release that does
    not know kind 3 or marker 2 (before runtime additions) refuses such a message or
    record, so every member runs this release before a member is added.
    batch   = partition:i32 start:i64 end:i64 opens:bool events:u32
              origin_len:u32 topic_len:u32 origin topic event[events]
    event   = offset:i64 timestamp_ms:i64 key_len:i32 value_len:i32 headers:u32
              key value (name_len:u32 value_len:i32 name value)[headers]

Fixed-size fields come first in each group so that one precompiled ``struct`` call
reads them all; the decoder is on the hot path (every event crosses it at least twice).
Peer messages (tags 1-15) and stored records (tags 16+) use separate tag ranges so a
record handed to the message decoder (or the reverse) is reported as such.

Modules: ``envelope`` (version, type tags, errors, the checks every decoder shares),
``batches`` (origin batches, their events, and log entries: the bulk of every encoding),
``messages`` (peer messages, tags 1-15) and ``records`` (stored records, tags 16+).
"""
