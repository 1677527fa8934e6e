// Package receipt is vmgate's signed receipt of one command: a small JSON
// document, signed by the daemon's ed25519 key, that says which command
// ran for whom, under which profile and policy, in which image, what came
// in and out of it, how it ended, and where its record is in the audit
// chain. A caller keeps it and can show it to anyone; `vmgated receipt
// verify` checks it offline, against the daemon's public key and, when
// given the audit log, against the record it names.
//
// This package is pure: the schema ([Body]), its encoding, signing
// ([Sign]), parsing ([Parse]) and verification ([Verify]); the key
// format and fingerprints ([Fingerprint], [ParsePrivateKey],
// [ParsePublicKey]); and the client's own check of the streams it
// received ([Body.Check]). Reading and creating the key files is in
// keyfile.go, apart from the rest.
//
// # The document
//
//	{"vmgate_receipt":1,"body":{…},"sig":"BASE64"}
//
// sig is the ed25519 signature of the bytes [SignedPrefix] followed by the
// body exactly as it appears in the document (the bytes between "body":
// and the comma), so the receipt is checked byte for byte: reformatting
// it (jq ., a pretty-printer) breaks it, as any change must. The body is
// encoded by encoding/json's Marshal (compact, HTML characters escaped),
// which Go programs re-encoding the document leave as it is. Its "key"
// field names the signing key by [Fingerprint]; the verifier gets the
// public key elsewhere (--key, the audit chain's checkpoints, vmgated
// receipt key) and never from the receipt.
//
// Arguments are [Arg]s: a JSON string when the bytes are valid UTF-8,
// else {"base64":"…"}, so any bytes the daemon ran survive ([ArgvOf]).
//
// # Threat model
//
// A receipt is evidence for a third party that the daemon holding the key
// said this: a command's inputs, outputs and outcome, as the daemon saw
// them. It proves nothing about a daemon whose key was stolen (whoever can
// read the key file, the daemon's user and root, can sign anything), and
// nothing about the guest's own honesty: the output is what the guest
// printed. The verifier's key must come from a channel the reader trusts.
// Verification refuses, naming the fault: a document that is not one
// (malformed JSON, unknown fields, bad base64, over [MaxSize]), a body
// changed after signing or a signature swapped from another receipt
// ([ErrSignature]), a body naming a key that is not the given one
// ([ErrKey]). A receipt checked against the audit log (by the caller of
// this package, with package audit) must also point at a record that is
// there, at that sequence number, with that hash, in an intact chain.
package receipt
