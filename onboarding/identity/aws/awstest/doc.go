// Package awstest provides loopback fakes of the AWS services an EC2
// or ECS onboarding touches, for tests and demos of Embark and of the packages that
// use its AWS identity verifier:
//
//   - [CA]: a demo "AWS region certificate" (self-signed RSA-2048) that
//     signs instance identity documents with an RSA-2048 PKCS#7 SignedData
//     as AWS does (content enclosed, SHA-256, signed attributes, no
//     certificates enclosed);
//   - [IMDS]: the EC2 instance metadata service (IMDSv2 only: a PUT
//     /latest/api/token session token is required) serving the document,
//     its rsa2048 signature, placement, and the instance profile's role
//     credentials;
//   - [STS]: the security token service's GetCallerIdentity, which checks
//     the AWS Signature Version 4 of every request with the secret keys it
//     issued (through IMDS) and answers with the caller's ARN, or with AWS's
//     error XML (SignatureDoesNotMatch, InvalidClientTokenId, ExpiredToken,
//     ...);
//   - [ECS]: the ECS API's DescribeTasks and DescribeTaskDefinition (AWS
//     JSON 1.1, SigV4-checked), and [TaskMetadata]: an ECS task's task
//     metadata endpoint v4 and container credentials endpoint, serving the
//     task role session STS issues for the task (named after its task ID).
//
// The fakes sit at the true external edge: they are meant to be driven by
// the real aws-sdk-go-v2 clients (feature/ec2/imds, credentials/ec2rolecreds,
// service/sts) and are faithful where the verifier's security depends on it;
// in particular the STS fake rejects any request whose signature, key,
// session token or date is wrong. They listen on 127.0.0.1 only.
//
// [Start] wires a CA, an STS and one instance's IMDS together for a test.
package awstest
