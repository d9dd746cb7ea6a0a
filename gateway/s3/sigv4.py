"""Server-side AWS Signature Version 4 verification of S3 requests (header and presigned forms).

Canonical forms live in `sigv4_canonical`; aws-chunked body signatures in `sigv4_chunked`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gateway import decimals
from gateway.bounded import Bounded
from gateway.errors import (
    AccessDenied,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidRequest,
    RequestTimeTooSkewed,
    S3Error,
    SignatureDoesNotMatch,
)
from gateway.s3.sigv4_canonical import (
    ALGORITHM,
    SigningKey,
    canonical_headers,
    canonical_query,
    canonical_uri,
    canonical_variants,
    http_date_to_amz,
    is_amz_date,
    iso8601,
    parse_amz_date,
    presigned_query,
)

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
MAX_PRESIGN_EXPIRES = 604800
_PAYLOAD_MODES = frozenset(
    {
        UNSIGNED_PAYLOAD,
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    }
)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}").fullmatch
_AUTH_FIELDS = frozenset({"Credential", "SignedHeaders", "Signature"})
_QUERY_FIELDS = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Signature",
        "X-Amz-Date",
        "X-Amz-SignedHeaders",
        "X-Amz-Expires",
    }
)
_SIGV2 = (
    "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
)
_NO_DATE = "AWS authentication requires a valid Date or x-amz-date header"
_UNSIGNED = "There were headers present in the request which were not signed"
_HEADER_PREFIX = "The authorization header is malformed; "
_QUERY_PREFIX = "Error parsing the X-Amz-Credential parameter; "


@dataclass(frozen=True, slots=True)
class AuthResult:
    """A request whose signature checked out, and what body verification needs to go on."""

    access_key: str
    # x-amz-content-sha256 as claimed: a hex digest, UNSIGNED-PAYLOAD or a STREAMING-* mode.
    payload_hash: str
    presigned: bool
    signature: str
    amz_date: str
    scope: str
    signing_key: bytes

    def __repr__(self) -> str:
        # The signing key stands in for the secret for a whole day: keep it out of logs.
        return (
            f"AuthResult(access_key={self.access_key!r}, payload_hash={self.payload_hash!r},"
            f" presigned={self.presigned}, amz_date={self.amz_date!r}, scope={self.scope!r})"
        )


class _Scope(NamedTuple):
    access_key: str
    date: str
    region: str
    service: str
    scope: str


class _Claim(NamedTuple):
    """What a request claims about its signature, parsed from either form."""

    scope: _Scope
    amz_date: str
    signed_headers: str  # as sent: the canonical request repeats it verbatim
    signed: list[str]
    signature: str
    payload_hash: str
    query: str  # canonical
    presigned: bool


_MEMO_TARGET_MAX = 2048  # longer request targets are verified every time, never kept
# A presigned URL as botocore makes it (boto3's and aws-cli's presign; the SignedHeaders before
# Expires) or in the canonical order: these parameters, each as canonical as sent (the
# credential's slashes escaped, %2F), the only signed header host. Its canonical query is then
# known from four values: no parsing, decoding, re-encoding or sorting
# (SigV4Verifier._presigned_quick).
_PRESIGNED_FORM = re.compile(
    r"X-Amz-Algorithm=AWS4-HMAC-SHA256"
    r"&X-Amz-Credential=([A-Za-z0-9]+%2F[0-9]{8}%2F[a-z0-9-]+%2Fs3%2Faws4_request)"
    r"&X-Amz-Date=([0-9]{8}T[0-9]{6}Z)"
    r"(?:&X-Amz-SignedHeaders=host&X-Amz-Expires=([1-9][0-9]{0,5})"
    r"|&X-Amz-Expires=([1-9][0-9]{0,5})&X-Amz-SignedHeaders=host)"
    r"&X-Amz-Signature=([0-9a-f]{64})"
).fullmatch


class SigV4Verifier:
    """Checks SigV4 signatures of S3 requests against secrets found by access key."""

    def __init__(
        self,
        lookup_secret: Callable[[str], str | None],
        *,
        region: str | None = None,
        max_skew: float = 900.0,
        clock: Callable[[], float] = time.time,
        cache_size: int = 1024,
    ) -> None:
        """`region=None` accepts any region in the credential scope, else others are refused."""
        self._lookup_secret = lookup_secret
        self._region = region
        self._max_skew = max_skew
        self._clock = clock
        self._keys: Bounded[tuple[str, str, str, str], SigningKey] = Bounded(cache_size)
        # Credential strings repeat across a client's requests all day: validate each once.
        self._scopes: Bounded[tuple[str, bool], _Scope] = Bounded(cache_size)
        # Presigned URLs already verified, as sent (a training job's loader or a benchmark
        # asks for the same URL many times): the result, the secret it was checked with and
        # when the URL expires. Exactly the same request target, host and method, with no
        # x-amz-* header beside it, is the same signed request: it verifies again while the
        # URL is valid and the key keeps its secret.
        self._presigned: Bounded[
            tuple[str, str, str, str | None], tuple[AuthResult, str, float]
        ] = Bounded(cache_size)

    def verify(
        self, method: str, raw_path: str, query_string: str, headers: Mapping[str, str]
    ) -> AuthResult | None:
        """Verify a request; None when it carries no authentication at all.

        `raw_path` is the path as sent (ASGI raw_path decoded as latin-1), `query_string` the
        raw query, `headers` lower-cased names with repeated values joined by ','.
        """
        authorization = headers.get("authorization")
        if authorization is not None:
            if "X-Amz-Algorithm=" in query_string:
                raise InvalidArgument(
                    "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter,"
                    " Signature query string parameter or the Authorization header should be"
                    " specified",
                    ArgumentName="Authorization",
                    ArgumentValue=authorization,
                )
            claim = self._header_claim(query_string, headers, authorization)
            return self._check(method, raw_path, headers, claim)
        if "X-Amz-" in query_string:
            bare = len(query_string) + len(raw_path) <= _MEMO_TARGET_MAX and not any(
                name.startswith("x-amz-") for name in headers
            )
            seen_as = (method, raw_path, query_string, headers.get("host"))
            if bare:
                seen = self._presigned.get(seen_as)
                if seen is not None:
                    result, secret, until = seen
                    if self._clock() <= until and self._lookup_secret(result.access_key) == secret:
                        return result
                    del self._presigned[seen_as]
                quick = self._presigned_quick(method, raw_path, query_string, seen_as[3])
                if quick is not None:
                    self._presigned.put(seen_as, quick)
                    return quick[0]
            params, canonical = presigned_query(query_string)
            if not _QUERY_FIELDS.isdisjoint(params):
                claim = self._query_claim(canonical, headers, params)
                result = self._check(method, raw_path, headers, claim)
                checked_with = self._lookup_secret(result.access_key)
                if bare and checked_with is not None:
                    until = _seconds(claim.amz_date) + int(params["X-Amz-Expires"])
                    memo = (result, checked_with, until)
                    self._presigned.put(seen_as, memo)
                return result
        if "AWSAccessKeyId=" in query_string and "Signature=" in query_string:
            raise InvalidRequest(_SIGV2)
        return None

    def _presigned_quick(
        self, method: str, raw_path: str, query_string: str, host: str | None
    ) -> tuple[AuthResult, str, float] | None:
        """A presigned URL of botocore's form (_PRESIGNED_FORM) sent with no x-amz-* header,
        verified in one step: the result, the secret it was checked with and when the URL
        expires. None for anything else, and for any doubt (a URL expired or not yet valid,
        a scope or signature that does not check out): the whole way then verifies it again
        and gives the error. What this accepts, the whole way accepts too."""
        match = _PRESIGNED_FORM(query_string)
        if match is None:
            return None
        credential, amz_date, expires_text, sorted_expires, provided = match.groups()
        expires_text = expires_text or sorted_expires
        expires = int(expires_text)
        issued = parse_amz_date(amz_date)
        if expires > MAX_PRESIGN_EXPIRES or issued is None:
            return None
        now = self._clock()
        if issued - now > self._max_skew or now > issued + expires:
            return None
        try:
            scope = self._scope(credential.replace("%2F", "/"), amz_date, presigned=True)
        except S3Error:
            return None
        secret = self._lookup_secret(scope.access_key)
        if secret is None:
            return None
        key = self._signing_key(secret, scope)
        canonical_request = (
            f"{method}\n{canonical_uri(raw_path)}\nX-Amz-Algorithm={ALGORITHM}"
            f"&X-Amz-Credential={credential}&X-Amz-Date={amz_date}&X-Amz-Expires={expires_text}"
            f"&X-Amz-SignedHeaders=host\nhost:{' '.join((host or '').split())}\n\nhost\n"
            f"{UNSIGNED_PAYLOAD}"
        )
        head = f"{ALGORITHM}\n{amz_date}\n{scope.scope}\n"
        if not key.signs(head, canonical_request.encode(), provided):
            return None
        result = _authorized(scope, key, amz_date, provided, UNSIGNED_PAYLOAD, presigned=True)
        return result, secret, issued + expires

    def verify_policy(
        self, credential: str, amz_date: str, policy: str, signature: str
    ) -> AuthResult:
        """A browser form's signature (POST Object): of its base64 policy document itself, by
        the signing key of the day, region and service its credential names. The credential's
        date is X-Amz-Date's; the policy's own expiration, not a skew, bounds its life."""
        if not is_amz_date(amz_date):
            raise InvalidArgument(
                "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\"",
                ArgumentName="x-amz-date",
                ArgumentValue=amz_date,
            )
        scope = self._scope(credential, amz_date, presigned=True)
        secret = self._lookup_secret(scope.access_key)
        if secret is None:
            raise InvalidAccessKeyId(AWSAccessKeyId=scope.access_key)
        key = self._signing_key(secret, scope)
        if not (signature.isascii() and hmac.compare_digest(key.sign(policy), signature)):
            raise SignatureDoesNotMatch(
                AWSAccessKeyId=scope.access_key, StringToSign=policy, SignatureProvided=signature
            )
        return _authorized(scope, key, amz_date, signature, UNSIGNED_PAYLOAD, presigned=False)

    def _header_claim(
        self, query_string: str, headers: Mapping[str, str], authorization: str
    ) -> _Claim:
        fields = _parse_authorization(authorization)
        amz_date = _header_date(headers)
        scope = self._scope(fields["Credential"], amz_date, presigned=False)
        signed = fields["SignedHeaders"].split(";")
        payload_hash = _header_payload_hash(headers, signed)
        _check_signed(signed, headers, exempt="")
        now = self._clock()
        if abs(now - _seconds(amz_date)) > self._max_skew:
            raise RequestTimeTooSkewed(
                RequestTime=amz_date,
                ServerTime=iso8601(now),
                MaxAllowedSkewMilliseconds=str(int(self._max_skew * 1000)),
            )
        return _Claim(
            scope=scope,
            amz_date=amz_date,
            signed_headers=fields["SignedHeaders"],
            signed=signed,
            signature=fields["Signature"],
            payload_hash=payload_hash,
            query=canonical_query(query_string),
            presigned=False,
        )

    def _query_claim(
        self, canonical: str, headers: Mapping[str, str], params: dict[str, str]
    ) -> _Claim:
        """A presigned URL's claim: `params` its X-Amz-* parameters, `canonical` its query
        in canonical form (both presigned_query's)."""
        expires = _presign_expires(params)
        amz_date = params["X-Amz-Date"]
        scope = self._scope(params["X-Amz-Credential"], amz_date, presigned=True)
        signed = params["X-Amz-SignedHeaders"].split(";")
        # An unsigned x-amz-content-sha256 is tolerated: it then binds nothing.
        _check_signed(signed, headers, exempt="x-amz-content-sha256")
        # A presigned URL carries no body hash unless the signer chose to bind one.
        payload_hash = params.get("X-Amz-Content-Sha256") or (
            headers.get("x-amz-content-sha256", UNSIGNED_PAYLOAD)
            if "x-amz-content-sha256" in signed
            else UNSIGNED_PAYLOAD
        )
        now = self._clock()
        issued = _seconds(amz_date)
        if issued - now > self._max_skew:
            # S3 gives X-Amz-Date back in epoch milliseconds here.
            raise AccessDenied(
                "Request is not yet valid",
                **{"X-Amz-Date": str(int(issued) * 1000)},
                Expires=iso8601(issued + expires),
                ServerTime=iso8601(now),
            )
        # X-Amz-Expires=0 is a URL that was never valid: S3 calls it expired.
        if now > issued + expires or expires == 0:
            raise AccessDenied(
                "Request has expired",
                **{"X-Amz-Expires": str(expires)},
                Expires=iso8601(issued + expires),
                ServerTime=iso8601(now),
            )
        return _Claim(
            scope=scope,
            amz_date=amz_date,
            signed_headers=params["X-Amz-SignedHeaders"],
            signed=signed,
            signature=params["X-Amz-Signature"],
            payload_hash=payload_hash,
            query=canonical,
            presigned=True,
        )

    def _scope(self, credential: str, amz_date: str, *, presigned: bool) -> _Scope:
        cached = self._scopes.get((credential, presigned))
        if cached is None:
            cached = self._parse_credential(credential, presigned)
            self._scopes.put((credential, presigned), cached)
        if cached.date != amz_date[:8]:
            error = AuthorizationQueryParametersError if presigned else AuthorizationHeaderMalformed
            prefix = _QUERY_PREFIX if presigned else _HEADER_PREFIX
            raise error(
                f'{prefix}Invalid credential date "{cached.date}". This date is not the same as'
                f' X-Amz-Date: "{amz_date[:8]}".'
            )
        return cached

    def _parse_credential(self, credential: str, presigned: bool) -> _Scope:
        error: type[S3Error] = (
            AuthorizationQueryParametersError if presigned else AuthorizationHeaderMalformed
        )
        prefix = _QUERY_PREFIX if presigned else _HEADER_PREFIX
        fields = credential.rsplit("/", 4)
        if len(fields) != 5 or not all(fields) or not _is_yyyymmdd(fields[1]):
            raise error(
                f"{prefix}the Credential is mal-formed; expecting"
                ' "<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".'
            )
        access_key, date, region, service, terminal = fields
        if terminal != "aws4_request":
            raise error(
                f'{prefix}incorrect terminal "{terminal}". This endpoint uses "aws4_request".'
            )
        if service != "s3":
            raise error(f'{prefix}incorrect service "{service}". This endpoint belongs to "s3".')
        if self._region is not None and region != self._region:
            raise error(
                f"{prefix}the region '{region}' is wrong; expecting '{self._region}'",
                Region=self._region,
            )
        return _Scope(access_key, date, region, service, f"{date}/{region}/{service}/aws4_request")

    def _signing_key(self, secret: str, scope: _Scope) -> SigningKey:
        cache_key = (secret, scope.date, scope.region, scope.service)
        key = self._keys.get(cache_key)
        if key is None:
            key = SigningKey.derive(secret, scope.date, scope.region, scope.service)
            self._keys.put(cache_key, key)
        return key

    def _check(
        self, method: str, raw_path: str, headers: Mapping[str, str], claim: _Claim
    ) -> AuthResult:
        scope = claim.scope
        secret = self._lookup_secret(scope.access_key)
        if secret is None:
            raise InvalidAccessKeyId(AWSAccessKeyId=scope.access_key)
        key = self._signing_key(secret, scope)
        tail = (
            f"\n{claim.query}\n{canonical_headers(claim.signed, headers)}\n"
            f"{claim.signed_headers}\n{claim.payload_hash}"
        )
        head = f"{ALGORITHM}\n{claim.amz_date}\n{scope.scope}\n"
        provided = claim.signature
        uri = canonical_uri(raw_path)
        canonical_request = f"{method}\n{uri}{tail}"
        if provided.isascii() and (
            key.signs(head, canonical_request.encode(), provided)
            or any(
                key.signs(head, variant, provided)
                for variant in canonical_variants(method, uri, raw_path, tail)
            )
        ):
            return _authorized(
                scope, key, claim.amz_date, provided, claim.payload_hash, claim.presigned
            )
        # S3 hands these back so clients can see which side canonicalized differently; neither
        # contains the secret.
        raise SignatureDoesNotMatch(
            AWSAccessKeyId=scope.access_key,
            StringToSign=head + hashlib.sha256(canonical_request.encode()).hexdigest(),
            SignatureProvided=provided,
            CanonicalRequest=canonical_request,
        )


def _authorized(
    scope: _Scope,
    key: SigningKey,
    amz_date: str,
    signature: str,
    payload_hash: str,
    presigned: bool,
) -> AuthResult:
    """What a signature that checked out, by the signing key of `scope`, authorizes."""
    return AuthResult(
        access_key=scope.access_key,
        payload_hash=payload_hash,
        presigned=presigned,
        signature=signature,
        amz_date=amz_date,
        scope=scope.scope,
        signing_key=key.key,
    )


def _parse_authorization(authorization: str) -> dict[str, str]:
    if not authorization.startswith(ALGORITHM) or authorization[16:17] not in " ,":
        if authorization.startswith("AWS "):
            raise InvalidRequest(_SIGV2)
        raise InvalidArgument(
            "Unsupported Authorization Type",
            ArgumentName="Authorization",
            ArgumentValue=authorization,
        )
    # Clients separate the three components with ", ", "," or " ": accept any mix.
    fields: dict[str, str] = {}
    for token in authorization[16:].replace(",", " ").split():
        name, _, value = token.partition("=")
        fields[name] = value
    if fields.keys() != _AUTH_FIELDS or not all(fields.values()):
        raise AuthorizationHeaderMalformed(
            f"{_HEADER_PREFIX}the authorization header requires three components:"
            " Credential, SignedHeaders, and Signature."
        )
    return fields


def _header_date(headers: Mapping[str, str]) -> str:
    """X-Amz-Date, or the Date header in its form, which is what the client signed."""
    amz_date = headers.get("x-amz-date")
    if amz_date is None:
        amz_date = http_date_to_amz(headers.get("date"))
    if amz_date is None or not is_amz_date(amz_date):
        raise AccessDenied(_NO_DATE)
    return amz_date


def _header_payload_hash(headers: Mapping[str, str], signed: list[str]) -> str:
    payload_hash = headers.get("x-amz-content-sha256")
    if payload_hash is None:
        raise InvalidRequest("Missing required header for this request: x-amz-content-sha256")
    if "x-amz-content-sha256" not in signed:
        raise InvalidRequest("header 'x-amz-content-sha256' must be included in signature")
    if not (_SHA256_HEX(payload_hash) or payload_hash in _PAYLOAD_MODES):
        raise InvalidArgument(
            "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER,"
            " STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER,"
            " or a valid sha256 value.",
            ArgumentName="x-amz-content-sha256",
            ArgumentValue=payload_hash,
        )
    return payload_hash


def _presign_expires(params: dict[str, str]) -> int:
    """Validate the presigned parameters that need no secret; return X-Amz-Expires."""
    if not _QUERY_FIELDS.issubset(params):
        raise AuthorizationQueryParametersError()
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise AuthorizationQueryParametersError('X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
    if not is_amz_date(params["X-Amz-Date"]):
        raise AuthorizationQueryParametersError(
            "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""
        )
    text = params["X-Amz-Expires"]
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise AuthorizationQueryParametersError("X-Amz-Expires should be a number")
    if text.startswith("-"):
        raise AuthorizationQueryParametersError("X-Amz-Expires must be non-negative")
    expires = decimals.parse(text, MAX_PRESIGN_EXPIRES)
    if expires is None:
        raise AuthorizationQueryParametersError(
            "X-Amz-Expires must be less than a week (in seconds); that is, the given"
            " X-Amz-Expires must be less than 604800 seconds"
        )
    return expires  # 0 is accepted here and refused as expired, as S3 does


def _check_signed(signed: list[str], headers: Mapping[str, str], exempt: str) -> None:
    """S3 requires host among the signed headers, and every x-amz-* header sent: unsigned ones
    would be open to tampering."""
    if "host" not in signed:
        raise AccessDenied(_UNSIGNED, HeadersNotSigned="host")
    unsigned = [
        name
        for name in headers
        if name.startswith("x-amz-") and name not in signed and name != exempt
    ]
    if unsigned:
        raise AccessDenied(_UNSIGNED, HeadersNotSigned=", ".join(unsigned))


def _is_yyyymmdd(value: str) -> bool:
    return len(value) == 8 and value.isascii() and value.isdigit()


def _seconds(amz_date: str) -> float:
    seconds = parse_amz_date(amz_date)
    if seconds is None:
        raise AccessDenied(_NO_DATE)
    return seconds
