"""Presidio's `encrypt` and `decrypt` operators: AES in CBC mode with PKCS7 padding and a random IV, the IV and the
cipher text URL-safe base64 encoded - so a text encrypted by presidio-anonymizer decrypts here and back. The key
comes in the request (Presidio keeps no key store, nor does rsinfer); it is never logged. `cryptography` does the
cipher: hand-written AES has no place here."""

from __future__ import annotations

import base64
import binascii
import os


def encrypt(key: bytes, text: str) -> str:
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    padder = padding.PKCS7(algorithms.AES.block_size).padder()
    padded = padder.update(text.encode("utf-8")) + padder.finalize()
    iv = os.urandom(16)
    enc = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.urlsafe_b64encode(iv + enc.update(padded) + enc.finalize()).decode()


def decrypt(key: bytes, text: str) -> str:
    """ValueError when the text is not such a cipher text for this key."""
    from cryptography.hazmat.primitives import padding
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    try:
        raw = base64.urlsafe_b64decode(text)
    except (binascii.Error, ValueError):
        raise ValueError("not base64") from None
    if len(raw) < 32 or len(raw) % 16:
        raise ValueError("not an AES-CBC cipher text")
    dec = Cipher(algorithms.AES(key), modes.CBC(raw[:16])).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    plain = dec.update(raw[16:]) + dec.finalize()
    try:
        return (unpadder.update(plain) + unpadder.finalize()).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 once decrypted") from None
